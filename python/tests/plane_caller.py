"""A caller process for the cross-process tests: sends one request and waits.

Usage: python plane_caller.py PATH REQUEST_JSON [TIMEOUT]. Prints {"event": "item"} for
each item and blocks; the test kills it to simulate a caller that died (or stops it:
a frozen caller). TIMEOUT (seconds) gives the request's context a deadline.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamo_ctx import Context, DistributedRuntime  # noqa: E402


async def main():
    runtime = DistributedRuntime()
    client = await runtime.endpoint(sys.argv[1]).client()
    await client.wait_for_instances()
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else None
    stream = await client.generate(json.loads(sys.argv[2]), annotated=False, context=Context("caller-req", timeout=timeout))
    async for item in stream:
        print(json.dumps({"event": "item", "item": item}), flush=True)
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main())
