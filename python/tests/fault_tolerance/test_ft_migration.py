"""A worker SIGKILLed mid-stream: the frontend migrates the request and the client sees every token once."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.slow

MAX_TOKENS = 120
DECODE = 0.01  # ~1.2 s per completion


def stream_text(client, model, prompt, rid, on_chunk=None):
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, stream=True, extra_headers={"x-request-id": rid}
    )
    texts, finish = [], []
    for chunk in stream:
        texts.append(chunk.choices[0].text)
        finish.append(chunk.choices[0].finish_reason)
        if on_chunk is not None:
            on_chunk(len(texts))
    return texts, [f for f in finish if f is not None]


def test_sigkill_mid_stream_migrates_without_loss_or_repeat(stack):
    stack.start([{"mode": "agg", "decode": DECODE}, {"mode": "agg", "decode": DECODE}], migration_limit=2)
    fe, workers = stack.frontend, stack.workers
    client = fe.openai()
    prompt = "Count on, whatever happens to the worker."

    # An uninterrupted run on the healthy stack first.
    base_rid = stack.new_id("migration-baseline")
    baseline, base_finish = stream_text(client, stack.model, prompt, base_rid)
    baseline_text = "".join(baseline)
    assert baseline_text == stack.expected_text(prompt, MAX_TOKENS)
    assert base_finish == ["length"]

    rid = stack.new_id("migration")
    victim = []

    def kill_busy_worker(n_chunks):
        if n_chunks != 10:
            return
        busy = [w for w in workers if w.metrics()["dynamo_ctx_worker_running_requests"] == 1]
        assert len(busy) == 1, [w.metrics() for w in workers]
        busy[0].kill()
        victim.append(busy[0])

    texts, finish = stream_text(client, stack.model, prompt, rid, kill_busy_worker)
    assert victim, "the stream ended before 10 chunks"
    (dead,) = victim
    (survivor,) = [w for w in workers if w is not dead]
    assert dead.returncode == -9

    text = "".join(texts)
    assert len(text.split()) == MAX_TOKENS, "every token arrived"
    assert text == baseline_text, "no token lost or repeated"
    assert finish == ["length"]
    assert dead.log_count(rf"New Request ID: {re.escape(rid)}$") == 1
    assert survivor.log_count(rf"New Request ID: {re.escape(rid)}$") == 1

    m = survivor.metrics()
    assert m["dynamo_ctx_worker_running_requests"] == 0
    assert m["dynamo_ctx_worker_kv_blocks_in_use"] == 0
    assert m["dynamo_ctx_worker_aborts_confirmed_total"] == 0
    f = fe.metrics()
    assert f["requests"] == 2
    assert f["cancellations"] == 0 and f["confirmed"] == 0

    # Requests right after the kill succeed too (round robin may still pick the dead
    # instance until discovery drops it: those migrate), and the frontend drops it.
    for _ in range(2):
        again = client.completions.create(model=stack.model, prompt=prompt, max_tokens=7)
        assert again.choices[0].text == stack.expected_text(prompt, 7)
        assert again.usage.completion_tokens == 7
    fe.wait_instances(1)
