"""The helper process of bench_plane.py: a worker, or a caller that gets killed.

Usage, with NATS_SERVER in the environment naming the NATS server:

  python plane_bench_worker.py serve PATH
      Serves PATH. Prints {"event": "ready", "instance": id} once serving,
      then serves until its stdin closes (then shuts the runtime down, so the
      instance leaves discovery at once) or it is killed.
  python plane_bench_worker.py call PATH
      Sends {"mode": "wait_kill"} to PATH, prints {"event": "item"} for each
      item and then blocks: the benchmark kills it to measure how fast the
      worker learns that its caller died.

Every event is one JSON line on stdout. Requests (JSON dicts):
  {"mode": "count", "n": N}  yields the ints 0 .. N-1 as fast as it can;
  {"mode": "forever"}        yields an int every millisecond until cancelled;
  {"mode": "wait_kill"}      yields 0, then awaits context.killed() and prints
      {"event": "killed", "t_ns": ..., "reason": ...}, t_ns being
      time.clock_gettime_ns(CLOCK_MONOTONIC) when the handler woke. On Linux
      CLOCK_MONOTONIC is one clock for the whole machine, so the benchmark
      subtracts its own reading taken just before ``ctx.kill()``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamo_ctx import Context, DistributedRuntime  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import killtrace  # noqa: E402

MONO = time.CLOCK_MONOTONIC


def record(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def make_handler(emit: Callable[[dict], None]):
    """The benchmark's handler (the modes above); its "killed" events go to
    emit. bench_plane.py uses it for its in-process runs too."""

    async def handler(request, context):
        mode = request.get("mode")
        if mode == "count":
            for i in range(request["n"]):
                yield i
        elif mode == "forever":
            i = 0
            while True:
                yield i
                i += 1
                await asyncio.sleep(0.001)
        elif mode == "wait_kill":
            yield 0
            woke = 0
            try:
                await context.killed()
                woke = time.clock_gettime_ns(MONO)
                killtrace.mark("worker.handler_woke", context.id())
            finally:
                # The dispatcher cancels a killed handler's task; whichever of
                # the two wakes it first, this is when the handler learned of
                # the kill.
                if not woke:
                    woke = time.clock_gettime_ns(MONO)
                    killtrace.mark("worker.handler_woke", context.id())
                emit({"event": "killed", "t_ns": woke, "reason": context.reason()})

    return handler


handler = make_handler(lambda event: record(**event))


async def serve(path: str) -> None:
    runtime = DistributedRuntime()
    killtrace.patch_loop()
    endpoint = runtime.endpoint(path)
    task = asyncio.ensure_future(endpoint.serve_endpoint(handler))
    record(event="ready", instance=await endpoint.serving())
    # Serve until the benchmark closes our stdin (or kills us).
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    runtime.shutdown()
    await task


async def call(path: str) -> None:
    runtime = DistributedRuntime()
    client = await runtime.endpoint(path).client()
    await client.wait_for_instances()
    stream = await client.generate({"mode": "wait_kill"}, annotated=False, context=Context("bench-dead-caller"))
    async for _ in stream:
        record(event="item")
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    role, path = sys.argv[1], sys.argv[2]
    asyncio.run(serve(path) if role == "serve" else call(path))
