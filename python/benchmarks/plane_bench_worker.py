"""The worker process of bench_plane.py.

Usage: python plane_bench_worker.py PATH, with NATS_SERVER in the environment
naming the NATS server. It prints one JSON line per event on stdout:
{"event": "ready", "instance": id} once serving, then for each "wait_kill"
request {"event": "killed", "t_ns": ..., "reason": ...}, where t_ns is
time.clock_gettime_ns(CLOCK_MONOTONIC) when the handler woke from
``await context.killed()``. CLOCK_MONOTONIC is one clock for the whole
machine on Linux, so the benchmark compares it with its own reading taken
just before ``ctx.kill()``. It serves until its stdin closes or it is killed.

Requests (JSON dicts):
  {"mode": "count", "n": N}  yields the ints 0 .. N-1 as fast as it can;
  {"mode": "wait_kill"}      yields 0, then awaits context.killed().
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamo_ctx import DistributedRuntime  # noqa: E402

MONO = time.CLOCK_MONOTONIC


def record(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def handler(request, context):
    mode = request.get("mode")
    if mode == "count":
        for i in range(request["n"]):
            yield i
    elif mode == "wait_kill":
        yield 0
        woke = 0
        try:
            await context.killed()
            woke = time.clock_gettime_ns(MONO)
        finally:
            # The dispatcher cancels a killed handler's task; whichever of the
            # two wakes it first, this is when the handler learned of the kill.
            if not woke:
                woke = time.clock_gettime_ns(MONO)
            record(event="killed", t_ns=woke, reason=context.reason())


async def main():
    runtime = DistributedRuntime()
    endpoint = runtime.endpoint(sys.argv[1])
    task = asyncio.ensure_future(endpoint.serve_endpoint(handler))
    record(event="ready", instance=await endpoint.serving())
    loop = asyncio.get_running_loop()
    # Serve until the benchmark closes our stdin (or kills us).
    await loop.run_in_executor(None, sys.stdin.read)
    runtime.shutdown()
    await task


if __name__ == "__main__":
    asyncio.run(main())
