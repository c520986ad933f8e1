"""Kills, handler errors and a closed runtime.

- A kill ends the stream: after the caller's context is killed (or the stream
  is closed), no item is returned, however the producer raced the kill.
- A handler that raises (CancelledError included) while its context is live
  is a handler error; the runtime's own teardown is not.
- A kill that reaches a handler while it awaits cancels its task: the await,
  ``await context.killed()`` included, raises CancelledError, every time.
- Calls on a shut-down runtime raise RuntimeClosed at once, without spinning.

The last section has the worker in another process (kill_worker.py, serving a
producer that never sleeps): the caller, in this process, kills at item k and
keeps iterating, and nothing may arrive after the kill; the same through
migration (the first worker SIGKILLed mid-stream, the stream continuing on the
second, where the caller kills it); and a handler's CancelledError.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from dynamo_ctx import Context, DistributedRuntime, RuntimeClosed
from harness import HANG, new_namespace, start_script
from helpers import run

HERE = Path(__file__).resolve().parent



def unique_path(kind="generate"):
    return f"{new_namespace('kill')}.backend.{kind}"


async def serve(runtime, path, handler):
    """Serve ``handler`` at ``path``; return the serving task once registered
    (its ``instance_id`` attribute is the instance's id)."""
    endpoint = runtime.endpoint(path)
    task = asyncio.ensure_future(endpoint.serve_endpoint(handler))
    task.instance_id = await endpoint.serving()
    return task


async def serve_and_connect(nats_url, handler):
    """A runtime serving ``handler`` at a fresh path, and a client that sees it:
    (runtime, serving task, client)."""
    rt = DistributedRuntime(nats_url=nats_url)
    path = unique_path()
    server = await serve(rt, path, handler)
    client = await rt.endpoint(path).client()
    await client.wait_for_instances()
    return rt, server, client


async def never_sleeping(request):
    """A producer that never awaits anything but its consumer."""
    for i in range(request["n"]):
        yield i


async def consume_killing_at(stream, ctx, k, how):
    """Iterate ``stream``, kill at item ``k`` (by ``how``), keep iterating;
    return the items received before and after the kill."""
    before, after = [], []
    killed = False
    async for item in stream:
        (after if killed else before).append(item)
        if not killed and item == k:
            killed = True
            if how == "kill":
                ctx.kill()
            elif how == "aclose":
                await stream.aclose()
            elif how == "parent":
                ctx.kill()  # ctx is the parent of the context given to generate
            elif how == "kill_late":
                # Let the producer finish first: its whole output waits in
                # buffers and the stream has ended when the kill comes.
                await asyncio.sleep(0.02)
                ctx.kill()
    return before, after


# --- item 4: a kill ends the stream ------------------------------------------


@pytest.mark.parametrize("migration_limit", [0, 2])
def test_kill_race_never_sleeping_producer(nats_url, migration_limit):
    """1,000 requests to a producer that never sleeps, killed at item k (k
    varying; by the caller's context, by its parent, or by aclose()): no
    item after the kill, ever."""
    iterations = 1000
    hows = ("kill", "aclose", "parent")

    async def main():
        rt = DistributedRuntime(nats_url=nats_url)
        path = unique_path()
        server = await serve(rt, path, never_sleeping)
        client = await rt.endpoint(path).client(migration_limit=migration_limit)
        await client.wait_for_instances()
        late = []
        for i in range(iterations):
            k, how = i % 17, hows[i % len(hows)]
            if how == "parent":
                killer = Context(f"race-{i}")
                ctx = killer.child()
            else:
                killer = ctx = Context(f"race-{i}")
            stream = await client.generate({"n": 64}, annotated=False, context=ctx)
            before, after = await consume_killing_at(stream, killer, k, how)
            assert before == list(range(k + 1))
            if after:
                late.append((i, k, how, after))
        rt.shutdown()
        await server
        return late

    late = run(main())
    assert late == [], f"{len(late)} of {iterations} streams returned items after the kill: {late[:5]}"


def test_kill_after_stream_end_drops_buffered_items(nats_url):
    """The old bug made deterministic: the producer finished (the stream
    ended, its context unlinked from the caller's) while the caller had taken
    only k items; a kill then still ends the stream."""

    async def main():
        rt = DistributedRuntime(nats_url=nats_url)
        path = unique_path()
        done = asyncio.Event()

        async def producer(request):
            for i in range(request["n"]):
                yield i
            done.set()

        server = await serve(rt, path, producer)
        client = await rt.endpoint(path).client()
        await client.wait_for_instances()
        for k in range(5):
            for how in ("kill", "aclose"):
                done.clear()
                ctx = Context()
                stream = await client.generate({"n": 50}, annotated=False, context=ctx)
                assert [await stream.__anext__() for _ in range(k + 1)] == list(range(k + 1))
                await asyncio.wait_for(done.wait(), HANG)
                await asyncio.sleep(0.02)  # the end reaches the caller's side
                if how == "kill":
                    ctx.kill()
                else:
                    await stream.aclose()
                assert [x async for x in stream] == []
        rt.shutdown()
        await server

    run(main())


def test_native_take_after_kill_returns_no_item(nats_url):
    """The C ABI holds the rule by itself: after a kill of the caller's
    context, dc_stream_take returns no item, not even the rest of a batch
    that an earlier call could not fit into its buffer."""
    from dynamo_ctx._lib import native

    lib = native()

    async def big(request):
        for _ in range(20):
            yield "x" * 5000  # three fit the 16 KiB buffer of one take
        done.set()

    async def main():
        nonlocal done
        done = asyncio.Event()
        rt = DistributedRuntime(nats_url=nats_url)
        path = unique_path()
        server = await serve(rt, path, big)
        client = await rt.endpoint(path).client()
        await client.wait_for_instances()
        ctx = Context()
        stream = await client.generate({}, annotated=False, context=ctx)
        await asyncio.wait_for(done.wait(), HANG)
        await asyncio.sleep(0.05)  # every item reached the caller's side
        code, items = lib.stream_take(stream._handle)
        assert code == lib.OK and 0 < len(items) < 20
        assert lib.stream_killed(stream._handle) is False
        ctx.kill()
        # The one rule of "killed" that ResponseStream applies to the items
        # it holds: the caller's context counts as well as the request's.
        assert lib.stream_killed(stream._handle) is True
        assert lib.stream_take(stream._handle)[0] == lib.EOF
        with pytest.raises(ValueError):
            lib.stream_killed(0xDEADBEEF)
        rt.shutdown()
        await server

    done = None
    run(main())


def test_kill_during_migrated_stream(nats_url):
    """The first worker sends 3 items and dies (its runtime shuts down); the
    stream migrates to the second; a kill at the second worker's item k ends
    the stream with nothing after it."""

    async def main():
        path = unique_path()
        hold = asyncio.Event()

        async def dies_after_three(request):
            for i in range(3):
                yield i
            await hold.wait()

        worker2 = DistributedRuntime(nats_url=nats_url)
        server2 = await serve(worker2, path, never_sleeping)
        caller = DistributedRuntime(nats_url=nats_url)
        client = await caller.endpoint(path).client(migration_limit=2)
        for i in range(10):
            worker1 = DistributedRuntime(nats_url=nats_url)
            server1 = await serve(worker1, path, dies_after_three)
            ep1 = server1.instance_id
            while ep1 not in client.instance_ids():
                await asyncio.sleep(0.01)
            ctx = Context(f"mig-{i}")
            stream = await client.direct({"n": 40}, ep1, annotated=False, context=ctx)
            assert [await stream.__anext__() for _ in range(3)] == [0, 1, 2]
            worker1.shutdown()  # the crash
            await server1
            k = i % 5
            # The second worker starts over (not a token stream): 0, 1, ...
            before, after = await consume_killing_at(stream, ctx, k, "kill" if i % 2 else "aclose")
            assert before == list(range(k + 1))
            assert after == []
        caller.shutdown()
        worker2.shutdown()
        await server2

    run(main())


# --- item 5: handler errors ---------------------------------------------------

WORDING = "a python exception was caught while processing the async generator: "


def test_handler_raising_cancelled_error_is_a_handler_error(nats_url):
    seen = []

    async def handler(request, context):
        yield 1
        seen.append(context)
        if request.get("message"):
            raise asyncio.CancelledError("given up")
        raise asyncio.CancelledError  # Dynamo's idiom: `if context.is_stopped(): raise asyncio.CancelledError`

    async def main():
        rt, server, client = await serve_and_connect(nats_url, handler)
        for request, text in (({}, "CancelledError: "), ({"message": True}, "CancelledError: given up")):
            stream = await client.generate(request, annotated=False)
            assert await stream.__anext__() == 1
            with pytest.raises(ValueError) as err:
                await stream.__anext__()
            assert str(err.value) == WORDING + text
        # The runtime is not torn down by it: the endpoint still serves.
        assert not server.done()
        rt.shutdown()
        await server

    run(main())
    assert all(not c.is_stopped() and not c.is_killed() for c in seen)


def test_teardown_cancel_is_not_a_handler_error(nats_url):
    """The handler's task cancelled from outside while its context is live
    (the loop or its owner tearing down) propagates as a cancellation: it is
    not reported as the handler's CancelledError."""
    tasks = []

    async def handler(request):
        yield 1
        tasks.append(asyncio.current_task())
        await asyncio.sleep(HANG)

    async def main():
        rt, server, client = await serve_and_connect(nats_url, handler)
        stream = await client.generate({}, annotated=False)
        assert await stream.__anext__() == 1
        while not tasks:
            await asyncio.sleep(0.01)
        tasks[0].cancel()
        with pytest.raises(ValueError) as err:
            await stream.__anext__()
        assert "CancelledError" not in str(err.value)
        assert str(err.value) == WORDING + "RuntimeError: the handler abandoned the request"
        await asyncio.sleep(0)
        assert tasks[0].cancelled()
        rt.shutdown()
        await server

    run(main())


# --- item 6: a kill while a handler awaits ------------------------------------


def test_kill_while_awaiting_always_cancels(nats_url):
    """1,000 kills, each reaching a handler that awaits ``context.killed()``:
    either already waiting when the kill's wake-up arrives, or calling it
    after seeing ``is_killed()`` but before the wake-up ran. Every time the
    await raises CancelledError, and cleanup in ``finally`` can still await."""
    kills = 1000
    outcomes = {"returned": 0, "cancelled": 0, "cleaned": 0}
    done = {}

    async def handler(request, context):
        yield 0
        try:
            if request["late"]:
                # Spin on the loop until the kill is visible, then await.
                # Each sleep(0) may itself be where the cancellation lands.
                while not context.is_killed():
                    await asyncio.sleep(0)
            await context.killed()
            outcomes["returned"] += 1
        except asyncio.CancelledError:
            outcomes["cancelled"] += 1
            raise
        finally:
            await asyncio.sleep(0)  # cleanup may await: the cancellation is not repeated
            outcomes["cleaned"] += 1
            done[context.id()].set()

    async def main():
        rt, server, client = await serve_and_connect(nats_url, handler)
        for i in range(kills):
            ctx = Context(f"await-{i}")
            done[ctx.id()] = asyncio.Event()
            stream = await client.generate({"late": i % 2 == 1}, annotated=False, context=ctx)
            assert await stream.__anext__() == 0
            if i % 4 >= 2:
                await asyncio.sleep(0)  # let the handler reach its await first
            ctx.kill()
            await asyncio.wait_for(done[ctx.id()].wait(), HANG)
            assert [x async for x in stream] == []
        rt.shutdown()
        await server

    run(main())
    assert outcomes == {"returned": 0, "cancelled": kills, "cleaned": kills}


def test_stopped_and_killed_again_after_kill_raise(nats_url):
    """In a killed handler's task, a second ``await context.killed()`` (or
    ``stopped()``) raises CancelledError too; other awaits work."""
    seen = {}

    async def handler(request, context):
        yield 0
        try:
            await context.killed()
        except asyncio.CancelledError:
            seen["first"] = "cancelled"
        for name in ("killed", "stopped"):
            try:
                await getattr(context, name)()
                seen[name] = "returned"
            except asyncio.CancelledError:
                seen[name] = "cancelled"
        await asyncio.sleep(0.001)
        seen["sleep"] = "ok"
        seen["done"].set()

    async def main():
        seen["done"] = asyncio.Event()
        rt, server, client = await serve_and_connect(nats_url, handler)
        ctx = Context()
        stream = await client.generate({}, annotated=False, context=ctx)
        assert await stream.__anext__() == 0
        ctx.kill()
        await asyncio.wait_for(seen["done"].wait(), HANG)
        rt.shutdown()
        await server

    run(main())
    assert {k: v for k, v in seen.items() if k != "done"} == {
        "first": "cancelled",
        "killed": "cancelled",
        "stopped": "cancelled",
        "sleep": "ok",
    }


def test_stop_does_not_cancel(nats_url):
    """Only a kill cancels: after stop_generating, ``await context.stopped()`` returns."""

    async def handler(request, context):
        yield 0
        assert await context.stopped() is True
        yield "after-stop"

    async def main():
        rt, server, client = await serve_and_connect(nats_url, handler)
        ctx = Context()
        stream = await client.generate({}, annotated=False, context=ctx)
        assert await stream.__anext__() == 0
        ctx.stop_generating()
        assert [x async for x in stream] == ["after-stop"]
        rt.shutdown()
        await server

    run(main())


# --- item 7: calls on a closed runtime ----------------------------------------

BOUND = 2.0  # seconds: generous, it catches hangs, it does not measure speed


async def within_bound(awaitable):
    t0 = time.monotonic()
    with pytest.raises(RuntimeClosed):
        await asyncio.wait_for(awaitable, BOUND * 5)
    assert time.monotonic() - t0 < BOUND


def test_calls_on_a_closed_runtime_raise_at_once(nats_url):
    async def handler(request):
        yield 1

    async def main():
        rt = DistributedRuntime(nats_url=nats_url)
        path = unique_path()
        ns, comp, name = path.split(".")
        endpoint = rt.endpoint(path)
        component = rt.namespace(ns).component(comp)
        client = await endpoint.client()
        rt.shutdown()
        rt.shutdown()  # idempotent
        cpu0 = time.process_time()
        await within_bound(client.wait_for_instances())
        await within_bound(client.generate({}))
        await within_bound(client.round_robin({}))
        await within_bound(client.random({}))
        await within_bound(client.direct({}, 1))
        await within_bound(endpoint.serve_endpoint(handler))
        await within_bound(endpoint.client())
        await within_bound(component.create_service())
        for lookup in (
            lambda: rt.namespace(ns),
            lambda: rt.endpoint(path),
            lambda: component.namespace.component(comp),
            lambda: component.endpoint(name),
            client.instance_ids,
        ):
            with pytest.raises(RuntimeClosed):
                lookup()
        assert time.process_time() - cpu0 < BOUND

    run(main())


def test_shutdown_during_wait_for_instances(nats_url):
    """A wait for instances that never come, then a shutdown: the wait raises
    RuntimeClosed at once, and meanwhile it did not spin."""

    async def main():
        rt = DistributedRuntime(nats_url=nats_url)
        client = await rt.endpoint(unique_path()).client()
        waiter = asyncio.ensure_future(client.wait_for_instances())
        cpu0 = time.process_time()
        await asyncio.sleep(0.5)
        assert not waiter.done()
        rt.shutdown()
        t0 = time.monotonic()
        with pytest.raises(RuntimeClosed):
            await asyncio.wait_for(waiter, BOUND * 5)
        assert time.monotonic() - t0 < BOUND
        # An idle wait costs next to nothing; a spinning one burns ~0.5 s.
        assert time.process_time() - cpu0 < 0.3

    run(main())


# --- items 4 and 5 with the worker in another process ------------------------


async def start_kill_worker(nats_url, path, *args):
    """kill_worker.py serving ``path``, once ready: its ``instance`` is set."""
    worker = start_script(HERE / "kill_worker.py", path, *args, nats_url=nats_url)
    worker.instance = (await worker.event_async("ready"))["instance"]
    return worker


@contextlib.asynccontextmanager
async def worker_and_runtime(nats_url, prefix):
    """A kill_worker.py process serving a fresh path (prefix + a random
    suffix) and a runtime to call it: yields (worker, runtime, path). The
    runtime shuts down and the worker is SIGKILLed at the end."""
    path = f"{new_namespace(prefix)}.worker.generate"
    worker = await start_kill_worker(nats_url, path)
    rt = DistributedRuntime(nats_url=nats_url)
    try:
        yield worker, rt, path
    finally:
        rt.shutdown()
        worker.kill()


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
                before, after = await consume_killing_at(stream, ctx, k, how)
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
                doomed = await start_kill_worker(nats_url, path, "--hang-after", "3")
                while doomed.instance not in client.instance_ids() or steady.instance not in client.instance_ids():
                    await asyncio.sleep(0.01)
                ctx = Context(f"xmig-{i}")
                stream = await client.direct({"n": 48}, doomed.instance, annotated=False, context=ctx)
                assert [await stream.__anext__() for _ in range(3)] == [0, 1, 2]
                doomed.kill()  # mid-stream: the stream migrates to the steady worker
                k = 2 + i
                before, after = await consume_killing_at(stream, ctx, k, ("kill", "aclose")[i % 2])
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
