"""A worker process for test_kill_rules.py (its last section).

Usage: python kill_worker.py PATH [--hang-after N]. NATS_SERVER in the
environment names the NATS server. Prints {"event": "ready", "instance": id}
once serving, then serves until killed. Requests:

- {"n": N}: yields 0..N-1 without ever sleeping (with --hang-after N: yields
  0..N-1 of them, then waits forever, so that the test can kill the process
  mid-stream).
- {"raise": "cancelled"}: yields 1, then raises asyncio.CancelledError while
  its context is live.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamo_ctx import DistributedRuntime  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--hang-after", type=int, default=None)
    args = parser.parse_args()

    async def handler(request, context):
        if request.get("raise") == "cancelled":
            yield 1
            raise asyncio.CancelledError("from the handler")
        n = request["n"]
        if args.hang_after is not None:
            for i in range(min(n, args.hang_after)):
                yield i
            await asyncio.Event().wait()
        for i in range(n):
            yield i

    async def serve() -> None:
        runtime = DistributedRuntime()
        endpoint = runtime.endpoint(args.path)
        task = asyncio.ensure_future(endpoint.serve_endpoint(handler))
        print(json.dumps({"event": "ready", "instance": await endpoint.serving()}), flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
