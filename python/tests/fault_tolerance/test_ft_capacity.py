"""Capacity shared by the fleet, as processes: several frontends in front of the same workers
never run more than a worker's --max-num-seqs on it. Each worker's own count is the authority
(a full worker refuses a request as busy, at once); the frontends route on the load the workers
publish, queue what finds no place and answer 503 overloaded past their queue. No client sees
any other 5xx, and every request is accounted for (docs/design.md, section 10)."""

from __future__ import annotations

import json
import threading
from collections import Counter

from harness import Frontend, read_all, send_post, split_response

FRONTENDS, WORKERS, MAX_NUM_SEQS, CLIENTS = 4, 2, 8, 200
MAX_TOKENS = 12
OUTCOMES = ("completed", "stopped", "cancelled", "deadline", "failed", "rejected")


def one_request(fe, body, rid):
    """One completion through frontend ``fe``: (status, body bytes)."""
    host, port = fe.host_port
    s = send_post(host, port, "/v1/completions", body, {"x-request-id": rid}, timeout=120)
    status, _, raw = split_response(read_all(s))
    return status, raw


def check_answer(status, raw, streamed):
    """A 200 carries the whole completion; a 503 is overloaded, before anything was streamed."""
    if status == 503:
        assert json.loads(raw)["error"]["code"] == "overloaded", raw
        return "overloaded"
    assert status == 200, (status, raw)
    if streamed:
        events = [line[len("data: "):] for line in raw.decode().split("\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks), chunks
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    else:
        assert json.loads(raw)["choices"][0]["finish_reason"] == "length", raw
    return "ok"


def test_frontends_share_the_workers_capacity(stack):
    worker = {"decode": 0.004, "args": ["--max-num-seqs", str(MAX_NUM_SEQS)]}
    frontend_args = ["--max-queued-requests", "16"]
    stack.start([worker] * WORKERS, frontend_args=frontend_args)
    frontends = [stack.frontend]
    for i in range(1, FRONTENDS):
        fe = Frontend(f"frontend{i}", stack.env, namespace=stack.namespace, args=frontend_args, log_dir=stack.log_dir)
        stack.procs.append(fe)
        frontends.append(fe)
    for fe in frontends[1:]:
        fe.ready()
        fe.wait_instances(WORKERS)

    results = {}
    start = threading.Barrier(CLIENTS)

    def client(i):
        streamed = i % 2 == 1
        body = {"model": stack.model, "prompt": f"capacity {i}", "max_tokens": MAX_TOKENS, "stream": streamed}
        start.wait(stack.hang)
        status, raw = one_request(frontends[i % FRONTENDS], body, stack.new_id(f"cap{i}"))
        results[i] = check_answer(status, raw, streamed)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(stack.hang)
    assert not any(t.is_alive() for t in threads), "a client hung"
    answers = Counter(results.values())
    assert sum(answers.values()) == CLIENTS, answers  # every client got a 200 or a 503 overloaded
    assert answers["ok"] > 0

    # No worker's engine ever held more than its --max-num-seqs.
    peaks = [w.metrics()["dynamo_ctx_worker_running_requests_peak"] for w in stack.workers]
    assert all(0 < p <= MAX_NUM_SEQS for p in peaks), peaks

    # Every request is accounted for: each frontend's outcomes add up to what it took,
    # completed are the 200s, rejected the 503s, and the workers ran each completed one once.
    outcomes, taken = Counter(), 0.0
    for fe in frontends:
        m = fe.raw_metrics()
        lbl = f'model="{stack.model}"'
        taken += m.get(f"dynamo_ctx_frontend_requests_total{{{lbl}}}", 0.0)
        for o in OUTCOMES:
            outcomes[o] += m.get(f'dynamo_ctx_frontend_outcomes_total{{{lbl},outcome="{o}"}}', 0.0)
    assert taken == CLIENTS and sum(outcomes.values()) == CLIENTS, (taken, outcomes)
    assert outcomes["completed"] == answers["ok"] and outcomes["rejected"] == answers["overloaded"], (outcomes, answers)
    ran = sum(w.metrics()["dynamo_ctx_worker_requests_total"] for w in stack.workers)
    assert ran == answers["ok"], (ran, answers)
