"""A kill ends the stream, and handler errors, across processes (issue 8, items 4 and 5).

The worker (kill_worker.py) is a separate process serving a producer that
never sleeps; the caller, in this process, kills at item k and keeps
iterating: nothing may arrive after the kill. The same through migration:
the first worker is SIGKILLed mid-stream and the stream continues on the
second, where the caller kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import pytest

from dynamo_ctx import Context, DistributedRuntime
from harness import start_script
from helpers import run

HERE = Path(__file__).resolve().parent


async def start_worker(nats_url, path, *args):
    """kill_worker.py serving ``path``, once ready: its ``instance`` is set."""
    worker = start_script(HERE / "kill_worker.py", path, *args, nats_url=nats_url)
    worker.instance = (await worker.event_async("ready"))["instance"]
    return worker


@contextlib.asynccontextmanager
async def worker_and_runtime(nats_url, prefix):
    """A kill_worker.py process serving a fresh path (prefix + a random
    suffix) and a runtime to call it: yields (worker, runtime, path). The
    runtime shuts down and the worker is SIGKILLed at the end."""
    path = f"{prefix}{uuid.uuid4().hex[:8]}.worker.generate"
    worker = await start_worker(nats_url, path)
    rt = DistributedRuntime(nats_url=nats_url)
    try:
        yield worker, rt, path
    finally:
        rt.shutdown()
        worker.kill()


async def kill_at(stream, ctx, k, how):
    """Iterate, kill at item k by ``how``, keep iterating; return (before, after)."""
    before, after, killed = [], [], False
    async for item in stream:
        (after if killed else before).append(item)
        if not killed and item == k:
            killed = True
            if how == "aclose":
                await stream.aclose()
            elif how == "kill_late":
                # Let the producer finish first: its whole output waits in
                # buffers and the stream has ended when the kill comes.
                await asyncio.sleep(0.02)
                ctx.kill()
            else:
                ctx.kill()
    return before, after


@pytest.mark.parametrize("migration_limit", [0, 2])
def test_kill_race_across_processes(nats_url, migration_limit):
    """200 requests to a worker process that never sleeps, killed at item k
    (varying; by the context, at once or once the producer finished, or by
    aclose()): no item after the kill."""
    iterations = 200

    async def main():
        async with worker_and_runtime(nats_url, "killp") as (worker, rt, path):
            client = await rt.endpoint(path).client(migration_limit=migration_limit)
            await client.wait_for_instances()
            late = []
            for i in range(iterations):
                k, how = i % 23, ("kill", "aclose", "kill_late")[i % 3]
                ctx = Context(f"xrace-{i}")
                stream = await client.generate({"n": 64}, annotated=False, context=ctx)
                before, after = await kill_at(stream, ctx, k, how)
                assert before == list(range(k + 1))
                if after:
                    late.append((i, k, how, after))
            assert late == [], f"{len(late)} of {iterations} streams returned items after the kill: {late[:5]}"
            # The worker is still serving normally.
            assert [x async for x in await client.generate({"n": 5}, annotated=False)] == list(range(5))

    run(main())


def test_kill_during_migrated_stream_across_processes(nats_url):
    async def main():
        async with worker_and_runtime(nats_url, "killm") as (steady, rt, path):
            client = await rt.endpoint(path).client(migration_limit=2)
            for i in range(3):
                doomed = await start_worker(nats_url, path, "--hang-after", "3")
                while doomed.instance not in client.instance_ids() or steady.instance not in client.instance_ids():
                    await asyncio.sleep(0.01)
                ctx = Context(f"xmig-{i}")
                stream = await client.direct({"n": 48}, doomed.instance, annotated=False, context=ctx)
                assert [await stream.__anext__() for _ in range(3)] == [0, 1, 2]
                doomed.kill()  # mid-stream: the stream migrates to the steady worker
                k = 2 + i
                before, after = await kill_at(stream, ctx, k, ("kill", "aclose")[i % 2])
                assert before == list(range(k + 1)), "the steady worker starts over (not a token stream)"
                assert after == []

    run(main())


def test_handler_cancelled_error_across_processes(nats_url):
    async def main():
        async with worker_and_runtime(nats_url, "killc") as (worker, rt, path):
            client = await rt.endpoint(path).client()
            await client.wait_for_instances()
            stream = await client.generate({"raise": "cancelled"}, annotated=False)
            assert await stream.__anext__() == 1
            with pytest.raises(ValueError) as err:
                await stream.__anext__()
            assert str(err.value) == (
                "a python exception was caught while processing the async generator: CancelledError: from the handler"
            )
            # The worker keeps serving.
            assert [x async for x in await client.generate({"n": 3}, annotated=False)] == [0, 1, 2]

    run(main())
