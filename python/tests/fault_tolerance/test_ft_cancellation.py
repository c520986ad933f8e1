"""Client disconnects through the OpenAI API abort the engine of an aggregated worker.

Each test cancels one request mid-decode and checks, end to end, that the worker's
engine confirmed the abort of exactly that request id and freed everything, and that
the frontend counted the cancellation, the confirmed abort and its latency.
"""

from __future__ import annotations

import openai
import pytest

# 100 tokens/s: a 5000-token completion would take ~50 s, so every request here is
# still decoding when the client goes away.
SLOW_DECODE = 0.01
LONG = 5000
CLIENT_TIMEOUT = 1.0


def agg_stack(stack):
    stack.start([{"mode": "agg", "decode": SLOW_DECODE}])
    return stack.frontend, stack.worker("agg")


def snapshot(fe, worker):
    return fe.metrics(), worker.metrics()


def assert_decoding_when_aborted(stack, worker, prompt, before):
    """The abort freed more KV blocks than the prompt alone holds: decode had started."""
    m = worker.metrics()
    freed = m["dynamo_ctx_worker_abort_freed_kv_blocks_total"] - before["dynamo_ctx_worker_abort_freed_kv_blocks_total"]
    prompt_blocks = -(-len(prompt.encode()) // 16)
    assert freed > prompt_blocks, f"the abort freed {freed} KV blocks; the prompt alone holds {prompt_blocks}"


@pytest.mark.slow
def test_completion_cancelled_by_client_timeout(stack):
    fe, worker = agg_stack(stack)
    f0, w0 = snapshot(fe, worker)
    rid = stack.new_id("timeout-completion")
    prompt = "Tell me a very long story about cancellation."
    client = fe.openai(timeout=CLIENT_TIMEOUT, max_retries=0)
    with pytest.raises(openai.APITimeoutError):
        client.completions.create(model=stack.model, prompt=prompt, max_tokens=LONG, extra_headers={"x-request-id": rid})
    worker.wait_log(rf"New Request ID: {rid}$")
    stack.assert_cancelled(worker, rid, w0, f0)
    assert_decoding_when_aborted(stack, worker, prompt, w0)
    assert fe.metrics()["requests"] == f0["requests"] + 1


@pytest.mark.slow
def test_chat_completion_cancelled_by_client_timeout(stack):
    fe, worker = agg_stack(stack)
    f0, w0 = snapshot(fe, worker)
    rid = stack.new_id("timeout-chat")
    messages = [{"role": "user", "content": "Tell me a very long story about cancellation."}]
    client = fe.openai(timeout=CLIENT_TIMEOUT, max_retries=0)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model=stack.model, messages=messages, max_tokens=LONG, extra_headers={"x-request-id": rid})
    worker.wait_log(rf"New Request ID: {rid}$")
    stack.assert_cancelled(worker, rid, w0, f0)
    assert_decoding_when_aborted(stack, worker, "user: " + messages[0]["content"] + "\n", w0)


def test_streaming_chat_closed_after_five_chunks(stack):
    fe, worker = agg_stack(stack)
    f0, w0 = snapshot(fe, worker)
    rid = stack.new_id("stream-chat")
    content = "Stream me a very long story."
    client = fe.openai()
    stream = client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": content}], max_tokens=LONG, stream=True,
        extra_headers={"x-request-id": rid},
    )
    assert stream.response.headers["x-request-id"] == rid
    texts = []
    for chunk in stream:
        assert chunk.id == "chatcmpl-" + rid  # the response id; x-request-id echoes the client's
        texts.append(chunk.choices[0].delta.content)
        if len(texts) == 5:
            break
    stream.close()
    prompt = f"user: {content}\n"
    assert "".join(texts) == stack.expected_text(prompt, 5)
    stack.assert_cancelled(worker, rid, w0, f0)
    m = worker.metrics()
    assert m["dynamo_ctx_worker_abort_freed_kv_blocks_total"] > w0["dynamo_ctx_worker_abort_freed_kv_blocks_total"]
