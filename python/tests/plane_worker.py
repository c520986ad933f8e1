"""A worker process for the cross-process tests.

Usage: python plane_worker.py PATH. NATS_SERVER in the environment names the
NATS server. It prints {"event": "ready", "instance": id} once serving, then
serves until killed. Each request is a dict with "mode"; the handler prints
one JSON line per thing its context saw, which the test reads from the pipe.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamo_ctx import DistributedRuntime  # noqa: E402

def record(**event):
    print(json.dumps(event), flush=True)


async def handler(request, context):
    mode = request.get("mode", "count")
    record(event="start", id=context.id(), mode=mode)
    if mode == "count":
        for i in range(request.get("n", 10)):
            yield i
    elif mode == "wait_kill":
        # Produce a few items, then wait to be killed (or lose the caller).
        try:
            for i in range(3):
                yield i
            await context.killed()
        finally:  # the dispatcher cancels a killed handler: record on the way out
            record(event="killed", id=context.id(), reason=context.reason(), stopped=context.is_stopped())
    elif mode == "forever":
        i = 0
        while True:
            yield i
            i += 1
            await asyncio.sleep(0.001)


async def main():
    runtime = DistributedRuntime()
    endpoint = runtime.endpoint(sys.argv[1])
    task = asyncio.ensure_future(endpoint.serve_endpoint(handler))
    record(event="ready", instance=await endpoint.serving())
    await task


if __name__ == "__main__":
    asyncio.run(main())
