"""Deadlines end to end: a client's x-request-timeout (and the frontend's --request-timeout)
kills the request at every hop when it passes; the worker confirms the engine's abort."""

from __future__ import annotations

import json
import re
import time

import pytest

from harness import read_all

DECODE = 0.01  # seconds per token: a 1,000-token completion takes 10 s


def sse_events(stack, body, headers):
    """Stream a completion over a raw socket; return (status, [event data], seconds taken)."""
    t0 = time.monotonic()
    data = read_all(stack.send_completion(body, headers))
    took = time.monotonic() - t0
    status = int(data.split(b" ", 2)[1])
    events = [m.group(1).decode() for m in re.finditer(rb"data: (.*?)\r?\n", data)]
    return status, events, took


def test_stream_past_its_deadline_ends_with_an_error_event(stack):
    stack.start([{"decode": DECODE}])
    w = stack.workers[0]
    rid = stack.new_id("deadline-stream")
    status, events, took = sse_events(
        stack, {"model": stack.model, "prompt": "tick", "max_tokens": 1000, "stream": True},
        {"x-request-id": rid, "x-request-timeout": "0.5"},
    )
    assert status == 200
    assert 0.5 <= took < 5, took
    assert "[DONE]" not in events
    last = json.loads(events[-1])
    assert last["error"]["code"] == "deadline_exceeded", last
    assert len(events) > 3, "tokens before the deadline"
    w.wait_log(rf"Aborted Request ID: {re.escape(rid)}(?: |$)")
    m = w.metrics()
    assert m["dynamo_ctx_worker_running_requests"] == 0 and m["dynamo_ctx_worker_kv_blocks_in_use"] == 0


def test_response_not_started_is_504(stack):
    import openai

    stack.start([{"decode": DECODE}])
    client = stack.frontend.openai()
    rid = stack.new_id("deadline-unary")
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=stack.model, prompt="tick", max_tokens=1000,
                                  extra_headers={"x-request-id": rid, "x-request-timeout": "0.4"})
    assert e.value.status_code == 504
    assert e.value.code == "deadline_exceeded"
    assert 0.4 <= time.monotonic() - t0 < 5
    stack.workers[0].wait_log(rf"Aborted Request ID: {re.escape(rid)}(?: |$)")


def test_frontend_default_and_bad_header(stack):
    import openai

    stack.start([{"decode": DECODE}], frontend_args=["--request-timeout", "0.3"])
    client = stack.frontend.openai()
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=stack.model, prompt="tick", max_tokens=1000)
    assert e.value.status_code == 504
    ok = client.completions.create(model=stack.model, prompt="tick", max_tokens=5, extra_headers={"x-request-timeout": "60"})
    assert ok.usage.completion_tokens == 5, "the smaller (0.3 s) still leaves time for 5 tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=stack.model, prompt="tick", max_tokens=5, extra_headers={"x-request-timeout": "-1"})
    assert e.value.code == "invalid_request_timeout" and "x-request-timeout" in str(e.value)
