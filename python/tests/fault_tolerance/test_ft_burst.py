"""A burst at start-up: the moment the frontend's /health lists the model (as a load
balancer waits for), hundreds of streams start at once. Every one is served and
completes token-exact: none refused as an unknown model (each model's first requests
once started their own discovery query, and the first to time out with no reply became
the model's view), none lost while the workers' stream connections pile up at the
frontend faster than it reads their Hellos.
"""

from __future__ import annotations

import asyncio
import resource

import pytest

from harness import stream_completion

pytestmark = pytest.mark.slow

STREAMS = 1000
MAX_TOKENS = 8


def prompt_of(i: int) -> str:
    return f"burst {i} " + "y" * (i % 19)


async def _burst(stack):
    addr = stack.frontend.host_port
    return await asyncio.gather(
        *[stream_completion(addr, stack.model, prompt_of(i), MAX_TOKENS, stack.new_id(f"burst-{i}")) for i in range(STREAMS)]
    )


@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_burst_right_after_health(stack, mode):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * STREAMS:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8 * STREAMS), hard))  # the stack's processes inherit it
    if mode == "aggregated":
        stack.start([{"decode": 0.005}, {"decode": 0.005}])
    else:
        stack.start([{"mode": "prefill", "prefill": 0.0001}, {"mode": "decode", "decode": 0.005}])
    results = asyncio.run(_burst(stack))
    bad = []
    for i, r in enumerate(results):
        if not (r.status == 200 and r.done and r.text == stack.expected_text(prompt_of(i), MAX_TOKENS) and not r.error):
            bad.append((r.rid, r.status, r.done, r.error[:200]))
    print(f"{mode}: {STREAMS - len(bad)}/{STREAMS} streams complete token-exact")
    assert not bad, f"{len(bad)} of {STREAMS} streams refused, lost or wrong: {bad[:5]}"
