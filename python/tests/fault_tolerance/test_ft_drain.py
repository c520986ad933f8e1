"""Graceful drain as an operator meets it: SIGTERM on a worker (a rolling deploy) and on the
frontend. A draining worker leaves discovery at once, finishes its streams, hands over what
outlives --drain-timeout (migration continues it token-exact) and exits 0; a second signal
ends it at once; the frontend stops accepting, lets its streams finish, then kills the rest
with reason shutdown."""

from __future__ import annotations

import json
import re
import signal
import threading
import time

from harness import http_get

DECODE = 0.01


def stream_lines(stack, body, rid, out, ready=None):
    """A streamed completion over a raw socket, its SSE events' data appended to out."""
    with stack.open_stream(body, {"x-request-id": rid}) as stream:
        for data in stream.data():
            out.append(data)
            if ready is not None:
                ready.set()


def text_of(events):
    chunks = [json.loads(e) for e in events if e.startswith("{")]
    return "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))


def health(worker):
    """The body of the worker's /health (a 503's too), or b"" when it does not answer."""
    try:
        return http_get(f"{worker.metrics_url}/health", timeout=2)[2]
    except Exception:  # noqa: BLE001 - gone, or going
        return b""


def start_stream(stack, body, rid):
    out, ready = [], threading.Event()
    t = threading.Thread(target=stream_lines, args=(stack, body, rid, out, ready), daemon=True)
    t.start()
    assert ready.wait(stack.hang), "no first chunk"
    return t, out


def busy(stack):
    (w,) = [w for w in stack.workers if w.metrics()["dynamo_ctx_worker_running_requests"] == 1]
    return w


def test_sigterm_finishes_the_streams_in_flight_and_exits_0(stack):
    stack.start([{"decode": DECODE, "args": ["--drain-timeout", "30"]}, {"decode": DECODE, "args": ["--drain-timeout", "30"]}],
                migration_limit=0)
    rid = stack.new_id("drain-finish")
    body = {"model": stack.model, "prompt": "tick", "max_tokens": 100}
    t, out = start_stream(stack, body, rid)
    victim = busy(stack)
    other = next(w for w in stack.workers if w is not victim)
    victim.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while b"draining" not in health(victim):
        assert time.monotonic() < deadline, "the draining worker's /health never said so"
        time.sleep(0.01)
    stack.frontend.wait_instances(1)  # it left discovery at once
    # New requests go to the other worker, and succeed.
    client = stack.frontend.openai()
    for _ in range(3):
        r = client.completions.create(model=stack.model, prompt="tick", max_tokens=3)
        assert r.usage.completion_tokens == 3
    t.join(stack.hang)
    assert out[-1] == "[DONE]", out[-3:]
    assert text_of(out) == stack.expected_text("tick", 100), "the stream in flight finished, whole"
    assert victim.wait(stack.hang) == 0
    victim.wait_log(r"drained: every request finished")
    assert other.log_count(rf"New Request ID: {re.escape(rid)}(?: |$)") == 0


def test_past_the_drain_timeout_streams_are_handed_over(stack):
    args = ["--drain-timeout", "0.3"]
    stack.start([{"decode": DECODE, "args": args}, {"decode": DECODE, "args": args}], migration_limit=2)
    rid = stack.new_id("drain-handover")
    body = {"model": stack.model, "prompt": "tick", "max_tokens": 200}
    t, out = start_stream(stack, body, rid)
    victim = busy(stack)
    other = next(w for w in stack.workers if w is not victim)
    victim.send_signal(signal.SIGTERM)
    t.join(stack.hang)
    assert out[-1] == "[DONE]", out[-3:]
    assert text_of(out) == stack.expected_text("tick", 200), "continued on the other worker, token-exact"
    assert victim.wait(stack.hang) == 0
    victim.wait_log(r"drained: the requests still running were handed over")
    other.wait_log(rf"New Request ID: {re.escape(rid)}(?: |$)")


def test_a_second_signal_ends_the_drain_at_once(stack):
    stack.start([{"decode": DECODE, "args": ["--drain-timeout", "60"]}], migration_limit=0)
    rid = stack.new_id("drain-twice")
    t, out = start_stream(stack, {"model": stack.model, "prompt": "tick", "max_tokens": 5000}, rid)
    (w,) = stack.workers
    w.send_signal(signal.SIGTERM)
    w.wait_log(r"draining: left discovery")
    t0 = time.monotonic()
    w.send_signal(signal.SIGTERM)
    assert w.wait(stack.hang) == 0
    assert time.monotonic() - t0 < 10, "not the 60 s drain"
    t.join(stack.hang)
    assert out[-1] != "[DONE]"


def test_frontend_sigterm_finishes_then_kills_with_reason_shutdown(stack):
    stack.start([{"decode": DECODE}], frontend_args=["--drain-timeout", "0.5"])
    fe = stack.frontend
    short_t, short = start_stream(stack, {"model": stack.model, "prompt": "tick", "max_tokens": 20}, stack.new_id("short"))
    long_rid = stack.new_id("long")
    long_t, long_ = start_stream(stack, {"model": stack.model, "prompt": "tick", "max_tokens": 5000}, long_rid)
    fe.send_signal(signal.SIGTERM)
    short_t.join(stack.hang)
    long_t.join(stack.hang)
    assert short[-1] == "[DONE]", "a stream shorter than the drain timeout finishes"
    last = json.loads(long_[-1])
    assert last["error"]["code"] == "shutdown", last
    assert fe.wait(stack.hang) == 0
    stack.workers[0].wait_log(rf"Aborted Request ID: {re.escape(long_rid)}(?: |$)")


def test_drain_racing_new_requests_loses_none(stack):
    """A drain races requests arriving at every moment: one that reaches the worker after
    it left discovery is refused unstarted and goes to the other worker, one that got in
    first finishes there. Five rounds, each SIGTERMs the busier worker in the middle of a
    burst and starts its replacement; migration limit 0, so a lost request would be an
    error."""
    args = ["--drain-timeout", "30"]
    stack.start([{"decode": 0.002, "args": args}, {"decode": 0.002, "args": args}], migration_limit=0)
    client = stack.frontend.openai()
    errors = []

    def one(i, r):
        try:
            out = client.completions.create(model=stack.model, prompt="tick", max_tokens=20,
                                             extra_headers={"x-request-id": stack.new_id(f"race{r}-{i}")})
            if out.usage.completion_tokens != 20:
                errors.append(f"round {r} request {i}: {out.usage.completion_tokens} tokens")
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(f"round {r} request {i}: {e!r}")

    for r in range(5):
        live = [w for w in stack.workers if w.running()]
        assert len(live) == 2
        threads = [threading.Thread(target=one, args=(i, r)) for i in range(30)]
        for i, t in enumerate(threads):
            t.start()
            if i == 15:
                live[r % 2].send_signal(signal.SIGTERM)
            time.sleep(0.003)
        for t in threads:
            t.join(stack.hang)
        assert live[r % 2].wait(stack.hang) == 0
        stack.workers.remove(live[r % 2])
        stack.start([{"decode": 0.002, "args": args}], frontend=False)  # waits until the frontend sees both
    assert errors == []


def test_sigterm_during_prefill_finishes_the_request(stack):
    """SIGTERM on the prefill worker, and on the decode worker, while a prompt is being
    prefilled: the drain lets the prefill (and the decode) finish; the client gets every
    token. Three rounds of each."""
    prefill = 0.002  # seconds per prompt token: a 200-character prompt prefills for 0.4 s
    stack.start([{"mode": "prefill", "prefill": prefill, "args": ["--drain-timeout", "30"]},
                 {"mode": "decode", "decode": 0.002, "args": ["--drain-timeout", "30"]}], migration_limit=0)
    client = stack.frontend.openai()
    prompt = "p" * 200
    for r in range(6):
        which = "prefill" if r % 2 == 0 else "decode"
        rid = stack.new_id(f"prefill-term{r}")
        victim = stack.worker(which)
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", client.completions.create(
            model=stack.model, prompt=prompt, max_tokens=5, extra_headers={"x-request-id": rid})))
        t.start()
        stack.worker("prefill").wait_log(rf"New Prefill Request ID: {re.escape(rid)}(?: |$)")
        victim.send_signal(signal.SIGTERM)
        t.join(stack.hang)
        assert "r" in out, f"round {r} ({which}): the request failed"
        assert out["r"].usage.completion_tokens == 5
        assert out["r"].choices[0].text == stack.expected_text(prompt, 5)
        assert victim.wait(stack.hang) == 0
        stack.workers.remove(victim)
        spec = {"mode": which, "args": ["--drain-timeout", "30"]}
        spec["prefill" if which == "prefill" else "decode"] = prefill if which == "prefill" else 0.002
        stack.start([spec], frontend=False)
