"""Routing on the engine's own load, as processes (docs/design.md, section 10): a worker's
engine publishes its waiting requests and KV cache usage with the worker's load report, and
the frontend sends new requests to another worker with the same free places whose engine
holds nothing back. And the busy refusals a worker counts: another frontend, which had not
heard the worker's last report, sends it a request past its capacity; the worker refuses it,
the frontend queues it again, and both count it."""

from __future__ import annotations

import json
import secrets
import threading

import pytest

from harness import Frontend, Subscription, read_all, send_post, split_response, wait_until


@pytest.fixture
def nats_token(monkeypatch):
    """The stack's NATS host and processes use this token (set before the ``stack`` fixture
    makes them), so that the test can read the bus too (harness.Subscription)."""
    token = secrets.token_hex(16)
    monkeypatch.setenv("NATS_TOKEN", token)
    return token


def next_report(sub, instance, ok):
    """The next load report of ``instance`` for which ``ok(report)`` holds."""
    while True:
        rep = json.loads(sub.next())
        if rep["instance"] == instance and ok(rep):
            return rep


def complete(fe, body, rid):
    host, port = fe.host_port
    status, _, raw = split_response(read_all(send_post(host, port, "/v1/completions", body, {"x-request-id": rid}, timeout=60)))
    return status, raw


def test_new_requests_go_past_an_engine_that_holds_requests_back(nats_token, stack):
    # The loaded worker: 6 places, a KV cache of 20 blocks of 16 tokens, which holds one
    # 200-token prompt (13 blocks) but not two: its second request waits in the engine.
    loaded = {"name": "loaded", "decode": 0.2,
              "args": ["--max-num-seqs", "6", "--num-gpu-blocks-override", "20", "--block-size", "16"]}
    stack.start([loaded])
    worker = stack.workers[0]
    with Subscription(stack.nats_url, f"dc.load.{stack.namespace}.backend.generate") as sub:
        held = [stack.open_stream({"model": stack.model, "prompt": [7] * 200, "max_tokens": 100},
                                  {"x-request-id": stack.new_id(f"held{i}")}) for i in range(2)]
        rep = next_report(sub, worker.instance_id, lambda r: r.get("waiting") == 1)
        assert rep["running"] == 2 and rep["capacity"] == 6 and 0.6 <= rep["kv_usage"] < 1, rep

    # The idle worker: 4 places. Both have 4 free (6 - 2, and 4): only the engine's figures
    # tell them apart (the loaded one has a request waiting, and a fuller KV cache).
    stack.start([{"name": "idle", "decode": 0.001, "args": ["--max-num-seqs", "4"]}], frontend=False)
    stack.frontend.wait_instances(2)
    idle = stack.workers[1]
    for i in range(6):
        status, raw = complete(stack.frontend, {"model": stack.model, "prompt": f"new {i}", "max_tokens": 2}, stack.new_id(f"new{i}"))
        assert status == 200, raw
    assert idle.metrics()["dynamo_ctx_worker_requests_total"] == 6
    assert worker.metrics()["dynamo_ctx_worker_requests_total"] == 2
    for s in held:
        s.close()


def test_busy_refusals_are_counted(nats_token, stack):
    stack.start([{"decode": 0.05, "args": ["--max-num-seqs", "1"]}])
    worker = stack.workers[0]
    with Subscription(stack.nats_url, f"dc.load.{stack.namespace}.backend.generate") as sub:
        held = stack.open_stream({"model": stack.model, "prompt": "held", "max_tokens": 1000}, {"x-request-id": stack.new_id("held")})
        next_report(sub, worker.instance_id, lambda r: r["running"] == 1)

    # Another frontend, started after the worker's last report: it believes the place free.
    other = Frontend("frontend1", stack.env, namespace=stack.namespace, args=["--max-queued-requests", "4"], log_dir=stack.log_dir)
    stack.procs.append(other)
    other.ready()
    other.wait_instances(1)
    answer = {}
    t = threading.Thread(target=lambda: answer.update(r=complete(other, {"model": stack.model, "prompt": "late", "max_tokens": 2},
                                                                 stack.new_id("late"))))
    t.start()
    requeued = f'dynamo_ctx_frontend_busy_requeues_total{{model="{stack.model}"}}'
    wait_until(lambda: other.raw_metrics().get(requeued, 0) >= 1, "the refused request queued again")
    assert worker.metrics()["dynamo_ctx_worker_busy_refusals_total"] == 1
    held.close()  # the place frees: the queued request is sent, and served
    t.join(stack.hang)
    assert answer["r"][0] == 200, answer
    assert worker.metrics()["dynamo_ctx_worker_busy_refusals_total"] == 1
