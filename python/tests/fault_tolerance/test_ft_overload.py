"""Overload as processes: workers declare --max-num-seqs, the frontend sends each request to the
worker with the most free places, queues up to --max-queued-requests when every place is taken,
then answers 503 overloaded with Retry-After at once; a queued request whose client leaves or
whose deadline passes never reaches a worker, and every request has one outcome."""

from __future__ import annotations

import json
import re
import threading
import time

from harness import read_all, split_response

DECODE = 0.01  # seconds per token
OUTCOMES = ("completed", "stopped", "cancelled", "deadline", "failed", "rejected")


def post(stack, body, headers, read=True):
    """A completion over a raw socket: (status, headers text, body bytes, seconds), or with
    read=False the open socket (the client stays until it closes it)."""
    t0 = time.monotonic()
    s = stack.send_completion(body, headers)
    if not read:
        return s
    data = read_all(s)
    took = time.monotonic() - t0
    return (*split_response(data), took)


def queued(stack):
    return stack.frontend.raw_metrics().get(f'dynamo_ctx_frontend_queued_requests{{model="{stack.model}"}}', 0.0)


def wait_queued(stack, n):
    deadline = time.monotonic() + stack.hang
    while queued(stack) != n:
        assert time.monotonic() < deadline, f"never {n} queued: {queued(stack)}"
        time.sleep(0.02)


def test_full_workers_queue_then_refuse_and_queued_requests_that_leave_never_start(stack):
    stack.start([{"decode": DECODE, "args": ["--max-num-seqs", "2"]}], frontend_args=["--max-queued-requests", "2"])
    w = stack.workers[0]
    body = {"model": stack.model, "prompt": "tick", "max_tokens": 150}  # 1.5 s each

    # Two run, two wait.
    results = {}

    def run(rid, headers=None):
        results[rid] = post(stack, body, dict(headers or {}, **{"x-request-id": rid}))

    running = [stack.new_id("run") for _ in range(2)]
    threads = [threading.Thread(target=run, args=(rid,)) for rid in running]
    for t in threads:
        t.start()
    for rid in running:
        w.wait_log(rf"New Request ID: {re.escape(rid)}(?: |$)")
    waiting = stack.new_id("wait")
    threads.append(threading.Thread(target=run, args=(waiting,)))
    threads[-1].start()
    wait_queued(stack, 1)
    gone = stack.new_id("gone")
    sock = post(stack, body, {"x-request-id": gone}, read=False)
    wait_queued(stack, 2)

    # The fifth: 503 overloaded, Retry-After, at once.
    status, head, raw, took = post(stack, body, {"x-request-id": stack.new_id("refused")})
    assert status == 503, raw
    assert json.loads(raw)["error"]["code"] == "overloaded"
    assert re.search(r"(?im)^retry-after: *\d+\r?$", head), head
    assert took < 1.0, took

    # A queued client that leaves is out of the queue at once and never starts.
    sock.close()
    wait_queued(stack, 1)
    # A queued request whose deadline passes: 504 and it never starts either (the queue
    # holds one, so it waits behind it).
    late = stack.new_id("late")
    status, _, raw, _ = post(stack, body, {"x-request-id": late, "x-request-timeout": "0.3"})
    assert status == 504, raw
    assert json.loads(raw)["error"]["code"] == "deadline_exceeded"

    for t in threads:
        t.join(stack.hang)
    for rid in running + [waiting]:
        status, _, raw, _ = results[rid]
        assert status == 200, raw
        assert json.loads(raw)["choices"][0]["finish_reason"] == "length"
    assert w.log_count(rf"New Request ID: {re.escape(gone)}(?: |$)") == 0
    assert w.log_count(rf"New Request ID: {re.escape(late)}(?: |$)") == 0
    # Never more than two at once on the engine: each ran its whole 1.5 s, so three ran
    # in about two rounds.
    m = stack.frontend.raw_metrics()
    lbl = f'model="{stack.model}"'
    outcomes = {o: m.get(f'dynamo_ctx_frontend_outcomes_total{{{lbl},outcome="{o}"}}', 0.0) for o in OUTCOMES}
    assert outcomes["completed"] == 3 and outcomes["rejected"] == 1 and outcomes["deadline"] == 1 and outcomes["cancelled"] == 1, outcomes
    assert sum(outcomes.values()) == m[f"dynamo_ctx_frontend_requests_total{{{lbl}}}"]
    assert w.metrics()["dynamo_ctx_worker_requests_total"] == 3


def test_requests_go_to_the_worker_with_the_most_free_places(stack):
    stack.start([
        {"decode": DECODE, "args": ["--max-num-seqs", "1"]},
        {"decode": DECODE, "args": ["--max-num-seqs", "3"]},
    ], frontend_args=["--max-queued-requests", "8"])
    small, big = stack.workers
    body = {"model": stack.model, "prompt": "tick", "max_tokens": 200, "stream": True}
    socks = []
    try:
        for i in range(4):
            socks.append(post(stack, body, {"x-request-id": stack.new_id(f"spread{i}")}, read=False))
        deadline = time.monotonic() + stack.hang
        while True:
            running = small.metrics()["dynamo_ctx_worker_running_requests"], big.metrics()["dynamo_ctx_worker_running_requests"]
            if running == (1, 3) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert running == (1, 3)
        socks.append(post(stack, body, {"x-request-id": stack.new_id("fifth")}, read=False))
        wait_queued(stack, 1)
    finally:
        for s in socks:
            s.close()
