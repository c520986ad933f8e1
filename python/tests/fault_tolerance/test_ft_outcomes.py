"""One outcome per request: under disconnects, deadlines, SIGKILL, SIGSTOP and SIGTERM, the
frontend's dynamo_ctx_frontend_outcomes_total and every live worker's
dynamo_ctx_worker_outcomes_total add up to the requests each took."""

from __future__ import annotations

import signal
import threading
import time

DECODE = 0.005
OUTCOMES = ("completed", "stopped", "cancelled", "deadline", "failed", "rejected")


def streamed(stack, body, headers, close_after=None):
    """A streamed completion; with close_after, the socket closes after that many chunks."""
    with stack.open_stream(body, headers) as stream:
        chunks = 0
        for data in stream.data():
            chunks += data.startswith("{")
            if close_after is not None and chunks >= close_after:
                return


def frontend_outcomes(stack):
    m = stack.frontend.raw_metrics()
    lbl = f'model="{stack.model}"'
    return {o: m.get(f'dynamo_ctx_frontend_outcomes_total{{{lbl},outcome="{o}"}}', 0.0) for o in OUTCOMES}, \
        m.get(f"dynamo_ctx_frontend_requests_total{{{lbl}}}", 0.0)


def worker_sums(w):
    m = w.metrics()
    return sum(m[f'dynamo_ctx_worker_outcomes_total{{outcome="{o}"}}'] for o in OUTCOMES), m["dynamo_ctx_worker_requests_total"]


def settle(stack, workers):
    """Wait (bounded) until every request ended everywhere, then check the sums."""
    deadline = time.monotonic() + stack.hang
    while True:
        outcomes, requests = frontend_outcomes(stack)
        ok = sum(outcomes.values()) == requests and all(worker_sums(w)[0] == worker_sums(w)[1] for w in workers)
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    outcomes, requests = frontend_outcomes(stack)
    assert sum(outcomes.values()) == requests > 0, (outcomes, requests)
    for w in workers:
        assert worker_sums(w)[0] == worker_sums(w)[1], (w.name, w.metrics())
    return outcomes


def run_load(stack, n, long_tokens=400):
    """n streams at once: a third complete, a third disconnect after 3 chunks, a third
    have a 0.2 s deadline."""
    threads = []
    for i in range(n):
        body = {"model": stack.model, "prompt": "tick", "max_tokens": 30 if i % 3 == 0 else long_tokens}
        headers = {"x-request-id": stack.new_id(f"o{i}")}
        close_after = None
        if i % 3 == 1:
            close_after = 3
        elif i % 3 == 2:
            headers["x-request-timeout"] = "0.2"
        t = threading.Thread(target=streamed, args=(stack, body, headers, close_after), daemon=True)
        t.start()
        threads.append(t)
    return threads


def test_outcomes_add_up_under_disconnects_deadlines_and_sigkill(stack):
    stack.start([{"decode": DECODE}, {"decode": DECODE}], migration_limit=1)
    victim, survivor = stack.workers
    threads = run_load(stack, 30)
    time.sleep(0.1)
    victim.kill()
    for t in threads:
        t.join(stack.hang)
    outcomes = settle(stack, [survivor])
    assert outcomes["completed"] >= 10 and outcomes["cancelled"] >= 10 and outcomes["deadline"] >= 1, outcomes


def test_outcomes_add_up_under_sigstop_and_sigterm(stack):
    stack.start([{"decode": DECODE, "args": ["--drain-timeout", "0.3"]}, {"decode": DECODE}], migration_limit=1)
    frozen, other = stack.workers
    threads = run_load(stack, 30)
    time.sleep(0.1)
    frozen.freeze()
    time.sleep(0.5)
    frozen.thaw()
    more = run_load(stack, 12)
    time.sleep(0.1)
    frozen.send_signal(signal.SIGTERM)  # drains, hands the rest over after 0.3 s, exits 0
    for t in threads + more:
        t.join(stack.hang)
    assert frozen.wait(stack.hang) == 0
    settle(stack, [other])
