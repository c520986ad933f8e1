"""What the Python tests share besides fixtures (those are in conftest.py) and the
process harness (harness/): running a coroutine, and a handler served in this process."""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, TypeVar

from harness import HANG, new_namespace

T = TypeVar("T")


def run(coro: "Coroutine[Any, Any, T]") -> T:
    """Run ``coro`` on a fresh event loop, failing if it takes longer than 2 * HANG."""
    return asyncio.run(asyncio.wait_for(coro, 2 * HANG))


class ServedEndpoint:
    """A runtime serving one endpoint (unique path per test) plus a client of it;
    ``async with`` it: the runtime shuts down at the end."""

    def __init__(self, nats_url, handler):
        from dynamo_ctx import DistributedRuntime

        self.runtime = DistributedRuntime(nats_url=nats_url)
        self.path = f"{new_namespace('test')}.backend.generate"
        self.endpoint = self.runtime.endpoint(self.path)
        self.handler = handler

    async def __aenter__(self):
        self.serve_task = asyncio.ensure_future(self.endpoint.serve_endpoint(self.handler))
        self.instance_id = await self.endpoint.serving()
        self.client = await self.endpoint.client()
        await self.client.wait_for_instances()
        return self

    async def __aexit__(self, *exc):
        self.runtime.shutdown()
        await asyncio.wait_for(self.serve_task, HANG)

    async def open(self):
        """A plain (not annotated) stream of an empty request, with a fresh
        Context of its own: (ctx, stream)."""
        from dynamo_ctx import Context

        ctx = Context()
        return ctx, await self.client.generate({}, annotated=False, context=ctx)


async def collect(stream):
    return [item async for item in stream]
