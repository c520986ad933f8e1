"""A worker process for test_dynamo_compat.py, written the way a Dynamo backend is.

Usage: python compat_worker.py NAMESPACE. NATS_SERVER names the NATS server.
Serves NAMESPACE.backend.generate (answers with what its context carries) and
NAMESPACE.backend.outer (calls NAMESPACE.backend.generate with context=its own
context, a child request, and passes the answers on). Prints
{"event": "ready", "pid": ...} once serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamo_ctx.runtime import DistributedRuntime, dynamo_worker  # noqa: E402


class Handler:
    def __init__(self, runtime: DistributedRuntime, namespace: str) -> None:
        self.runtime, self.namespace = runtime, namespace
        self.inner = None

    async def generate(self, request, context):
        # The handler's metadata is its own live copy: changes stay here.
        context.metadata["seen_by"] = os.getpid()
        for i in range(request.get("n", 3)):
            if context.is_stopped():
                return
            yield {"i": i, "pid": os.getpid(), "id": context.id(), "metadata": dict(context.metadata)}
            await asyncio.sleep(request.get("delay", 0))

    async def outer(self, request, context):
        if self.inner is None:
            self.inner = await self.runtime.endpoint(f"{self.namespace}.backend.generate").client()
            await self.inner.wait_for_instances()
        context.metadata["hop"] = "outer"
        stream = await self.inner.generate(request, context=context)
        async for item in stream:
            yield {"outer_metadata": dict(context.metadata), **item.data()}


@dynamo_worker()
async def worker(runtime: DistributedRuntime, namespace: str) -> None:
    handler = Handler(runtime, namespace)
    component = runtime.namespace(namespace).component("backend")
    await component.create_service()
    generate = component.endpoint("generate")
    outer = component.endpoint("outer")
    tasks = [asyncio.ensure_future(generate.serve_endpoint(handler.generate)), asyncio.ensure_future(outer.serve_endpoint(handler.outer))]
    await generate.serving()
    await outer.serving()
    print(json.dumps({"event": "ready", "pid": os.getpid()}), flush=True)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(worker(sys.argv[1]))
