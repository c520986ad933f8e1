"""Disaggregated prefill + decode workers: a client disconnect aborts decode, or prefill before any token."""

from __future__ import annotations

import re

import pytest


@pytest.mark.slow
def test_disaggregated_cancelled_during_decode(stack):
    stack.start([{"mode": "prefill"}, {"mode": "decode", "decode": 0.01}])
    fe, prefill, decode = stack.frontend, stack.worker("prefill"), stack.worker("decode")
    f0, p0, d0 = fe.metrics(), prefill.metrics(), decode.metrics()
    rid = stack.new_id("disagg-decode")
    prompt = "Decode me a very long answer."
    stream = fe.openai().completions.create(
        model=stack.model, prompt=prompt, max_tokens=5000, stream=True, extra_headers={"x-request-id": rid}
    )
    texts = []
    for chunk in stream:
        texts.append(chunk.choices[0].text)
        if len(texts) == 5:
            break
    stream.close()
    # The first token came from the prefill worker, the rest from the decode engine.
    assert "".join(texts) == stack.expected_text(prompt, len(texts))
    prefill.wait_log(rf"New Prefill Request ID: {re.escape(rid)}(?: |$)")
    decode.wait_log(rf"New Request ID: {re.escape(rid)}(?: |$)")

    stack.assert_cancelled(decode, rid, d0, f0)
    m = decode.metrics()
    assert m["dynamo_ctx_worker_abort_freed_kv_blocks_total"] > d0["dynamo_ctx_worker_abort_freed_kv_blocks_total"]
    # Prefill had finished normally before decode began: nothing to abort, nothing held.
    p = prefill.metrics()
    assert p["dynamo_ctx_worker_requests_total"] == p0["dynamo_ctx_worker_requests_total"] + 1
    assert p["dynamo_ctx_worker_aborts_confirmed_total"] == p0["dynamo_ctx_worker_aborts_confirmed_total"]
    assert p["dynamo_ctx_worker_running_requests"] == 0
    assert p["dynamo_ctx_worker_kv_blocks_in_use"] == 0
    assert prefill.log_count(rf"Aborted Prefill Request ID: {re.escape(rid)}(?: |$)") == 0


PREFILL_PER_TOKEN = 0.005
PROMPT_CHARS = 2000  # x 0.005 s = 10 s of prefill


def test_disaggregated_cancelled_during_prefill_by_socket_close(stack):
    stack.start([{"mode": "prefill", "prefill": PREFILL_PER_TOKEN}, {"mode": "decode"}])
    fe, prefill, decode = stack.frontend, stack.worker("prefill"), stack.worker("decode")
    f0, p0, d0 = fe.metrics(), prefill.metrics(), decode.metrics()
    rid = stack.new_id("disagg-prefill")
    sock = stack.send_completion({"model": stack.model, "prompt": "p" * PROMPT_CHARS, "max_tokens": 50}, {"x-request-id": rid})
    try:
        prefill.wait_log(rf"New Prefill Request ID: {re.escape(rid)}(?: |$)")
        m = prefill.metrics()
        assert m["dynamo_ctx_worker_running_requests"] == 1
        held = m["dynamo_ctx_worker_kv_blocks_in_use"]
        assert held == -(-PROMPT_CHARS // 16)
    finally:
        sock.close()

    # The abort must come long before the 10 s prefill could have ended by itself.
    prefill.wait_log(rf"Aborted Prefill Request ID: {re.escape(rid)}(?: |$)", timeout=PREFILL_PER_TOKEN * PROMPT_CHARS / 2)
    stack.assert_cancelled(prefill, rid, p0, f0, label="Prefill ")
    p = prefill.metrics()
    assert p["dynamo_ctx_worker_abort_freed_kv_blocks_total"] - p0["dynamo_ctx_worker_abort_freed_kv_blocks_total"] == held
    # The decode engine never started on this request and holds nothing.
    d = decode.metrics()
    assert d["dynamo_ctx_worker_running_requests"] == 0
    assert d["dynamo_ctx_worker_kv_blocks_in_use"] == 0
    # It received the request (counted) and ended it, cancelled, in its prefill call.
    assert d["dynamo_ctx_worker_requests_total"] == d0["dynamo_ctx_worker_requests_total"] + 1
    assert d['dynamo_ctx_worker_outcomes_total{outcome="cancelled"}'] == d0['dynamo_ctx_worker_outcomes_total{outcome="cancelled"}'] + 1
    assert decode.log_count(rf"New Request ID: {re.escape(rid)}(?: |$)") == 0
