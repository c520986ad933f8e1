"""Faults mid-stream: 64 concurrent streams through the frontend while a worker is
SIGKILLed, SIGSTOPped past the liveness bound, or the process hosting the embedded NATS
server (which also runs a worker) is SIGKILLed. Every stream completes token-exact (none
lost, none repeated) and a new request succeeds soon after the fault.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from harness import check_streams, free_port, streams_through_fault

pytestmark = pytest.mark.slow

STREAMS = 64
MAX_TOKENS = 100
DECODE = 0.02  # ~2 s per completion: every stream is mid-flight at the fault
STALL = 4.0  # SIGSTOP this long: past the 2.5 s stream idle bound


def prompt_of(i: int) -> str:
    # Different lengths give different token sequences, so a mixed-up stream shows.
    return f"stream {i} " + "x" * (i % 23)


PROMPTS = [prompt_of(i) for i in range(STREAMS)]


async def _through_fault(stack, fault):
    """Run STREAMS streams, call ``fault()`` once they are a few tokens in, then request
    until one succeeds; returns (results, seconds from the fault to that success, seconds
    until every stream ended)."""
    return await streams_through_fault(stack, fault, PROMPTS, MAX_TOKENS, "fire", "after the fault")


def _wait_idle(stack, workers):
    deadline = time.monotonic() + stack.hang
    for w in workers:
        while True:
            m = w.metrics()
            if m["dynamo_ctx_worker_running_requests"] == 0 and m["dynamo_ctx_worker_kv_blocks_in_use"] == 0:
                break
            assert time.monotonic() < deadline, f"{w.name} never went idle: {m}"
            time.sleep(0.05)


def test_sigkill_worker_through_fault(stack):
    stack.start([{"decode": DECODE}] * 3, migration_limit=2)
    victim = stack.workers[0]
    results, recovered, _ = asyncio.run(_through_fault(stack, victim.kill))
    check_streams(stack, PROMPTS, MAX_TOKENS, results, recovered, "SIGKILL worker")
    assert victim.returncode == -signal.SIGKILL
    _wait_idle(stack, stack.workers[1:])


def test_sigstop_worker_through_fault(stack):
    stack.start([{"decode": DECODE}] * 3, migration_limit=2)
    victim = stack.workers[0]

    def stall():
        victim.freeze()
        # Resume later, while the test goes on (the liveness check must not wait for it).
        threading.Timer(STALL, lambda: victim.thaw()).start()

    t0 = time.monotonic()
    results, recovered, took = asyncio.run(_through_fault(stack, stall))
    check_streams(stack, PROMPTS, MAX_TOKENS, results, recovered, "SIGSTOP worker")
    # Nothing waited for the stall to end: the migrated streams finished on the others.
    assert took < 0.7 + STALL + 3 * MAX_TOKENS * DECODE + 20, took
    time.sleep(max(0.0, t0 + 0.7 + STALL + 0.2 - time.monotonic()))
    _wait_idle(stack, stack.workers)  # the resumed worker cleaned up its abandoned requests


def test_sigkill_nats_host_worker_through_fault(stack):
    # The first worker hosts the embedded NATS server on its own port; the frontend and the
    # other workers join it, and take the address over when it dies.
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    stack.start([{"decode": DECODE, "env": {"NATS_SERVER": url, "DYNAMO_CTX_EMBED_NATS": "1"}}], frontend=False)
    stack.env["NATS_SERVER"] = url
    stack.start([{"decode": DECODE}] * 2, migration_limit=2)
    host = stack.workers[0]
    results, recovered, _ = asyncio.run(_through_fault(stack, host.kill))
    check_streams(stack, PROMPTS, MAX_TOKENS, results, recovered, "SIGKILL NATS host + worker")
    assert recovered < 10, recovered
    _wait_idle(stack, stack.workers[1:])
    stack.frontend.wait_instances(2)
