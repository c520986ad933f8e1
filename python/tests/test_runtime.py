"""The runtime and request plane (docs/design.md, sections 3 and 6): requests, context
relay, stop and kill, handler errors, kills across hops, errors as exceptions; first with
caller and handler in one process, then (last section) across processes: kills and stops
reaching a handler in another process (plane_worker.py), a caller's or a worker's death
(SIGKILL), a frozen caller's deadline, and the embedded default NATS address shared by
processes.

A handler's items on their way (encoding, batching, the native sends) are in
test_handler_sends.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import time
import uuid
from pathlib import Path

import pytest

from dynamo_ctx import Context, DistributedRuntime, NoResponders, RuntimeClosed, StreamIncomplete
from harness import HANG, child_env, new_namespace, private_network, run_python, start_script
from helpers import ServedEndpoint, collect, run

HERE = Path(__file__).resolve().parent


def test_roundtrip_annotated_and_plain(nats_url):
    async def handler(request):
        for i in range(request["n"]):
            yield {"i": i}

    async def main():
        async with ServedEndpoint(nats_url, handler) as h:
            assert h.client.instance_ids() == [h.instance_id]
            items = await collect(await h.client.generate({"n": 5}))
            assert [it.data() for it in items] == [{"i": i} for i in range(5)]
            plain = await collect(await h.client.round_robin({"n": 3}, annotated=False))
            assert plain == [{"i": 0}, {"i": 1}, {"i": 2}]
            assert len(await collect(await h.client.random({"n": 2}))) == 2
            assert len(await collect(await h.client.direct({"n": 4}, h.instance_id))) == 4

    run(main())


def test_context_id_is_relayed(nats_url):
    seen = []

    async def handler(request, context):
        seen.append(context.id())
        yield context.id()

    async def main():
        async with ServedEndpoint(nats_url, handler) as h:
            ctx = Context(id="req-42")
            assert [x.data() for x in await collect(await h.client.generate({}, context=ctx))] == ["req-42"]
            fresh = [x.data() for x in await collect(await h.client.generate({}))]
            assert fresh[0] != "req-42" and uuid.UUID(fresh[0])

    run(main())
    assert seen[0] == "req-42"


def test_context_parameter_detection(nats_url):
    calls = []

    async def no_context(request):
        calls.append("plain")
        yield 1

    def deco(f):
        @functools.wraps(f)
        async def wrapper(*args, **kwargs):
            async for x in f(*args, **kwargs):
                yield x

        return wrapper

    @deco
    async def wrapped(request, context):
        calls.append(("wrapped", context.id()))
        yield 2

    class Worker:
        async def generate(self, request, context):
            calls.append(("method", context.id()))
            yield 3

    async def main():
        for handler, want in ((no_context, 1), (wrapped, 2), (Worker().generate, 3)):
            async with ServedEndpoint(nats_url, handler) as h:
                got = await collect(await h.client.generate({}, annotated=False, context=Context("cid")))
                assert got == [want]

    run(main())
    assert calls == ["plain", ("wrapped", "cid"), ("method", "cid")]


def test_client_stop_stops_handler_and_stream_ends_cleanly(nats_url):
    async def handler(request, context):
        for i in range(3):
            yield i
        await context.stopped()
        yield {"stopped": context.is_stopped(), "killed": context.is_killed(), "reason": context.reason()}

    async def main():
        async with ServedEndpoint(nats_url, handler) as h:
            ctx, stream = await h.open()
            got = []
            async for item in stream:
                got.append(item)
                if len(got) == 3:
                    ctx.stop_generating()
            assert got == [0, 1, 2, {"stopped": True, "killed": False, "reason": "stop_generating"}]

    run(main())


def test_client_kill_kills_handler(nats_url):
    seen = {}

    async def handler(request, context):
        try:
            yield 0
            await context.killed()  # the dispatcher cancels the handler on kill: finally runs
        finally:
            seen["state"] = (context.is_stopped(), context.is_killed(), context.reason())
            seen["done"].set()

    async def main():
        seen["done"] = asyncio.Event()
        async with ServedEndpoint(nats_url, handler) as h:
            ctx, stream = await h.open()
            assert await stream.__anext__() == 0
            ctx.kill()
            await seen["done"].wait()
            assert await collect(stream) == []

    run(main())
    assert seen["state"] == (True, True, "kill")


def test_context_stopped_before_generate(nats_url):
    seen = []

    async def handler(request, context):
        seen.append((context.is_stopped(), context.is_killed()))
        i = 0
        while not context.is_stopped():
            yield i
            i += 1

    async def main():
        async with ServedEndpoint(nats_url, handler) as h:
            ctx = Context()
            ctx.stop_generating()
            assert await collect(await h.client.generate({}, context=ctx)) == []

    run(main())
    assert seen == [(True, False)]


def test_break_cancels_nothing(nats_url):
    async def handler(request):
        for i in range(6):
            yield i

    async def main():
        async with ServedEndpoint(nats_url, handler) as h:
            stream = await h.client.generate({}, annotated=False)
            first = []
            async for item in stream:
                first.append(item)
                if len(first) == 2:
                    break
            rest = await collect(stream)
            assert first + rest == list(range(6))

    run(main())


def test_aclose_and_garbage_collection_kill(nats_url):
    reasons = []
    done = {}

    async def handler(request, context):
        try:
            yield 0
            await context.killed()
        finally:
            reasons.append(context.reason())
            done[len(reasons)].set()

    async def main():
        done[1], done[2] = asyncio.Event(), asyncio.Event()
        async with ServedEndpoint(nats_url, handler) as h:
            stream = await h.client.generate({})
            await stream.__anext__()
            await stream.aclose()
            await done[1].wait()
            stream = await h.client.generate({})
            await stream.__anext__()
            del stream
            gc.collect()
            await done[2].wait()

    run(main())
    assert reasons == ["kill", "kill"]


async def error_after_first_item(h, expected):
    """Opens a stream whose handler yields 1 and then ends badly; returns the
    error (an ``expected``) that the second item raises."""
    stream = await h.client.generate({}, annotated=False)
    assert await stream.__anext__() == 1
    with pytest.raises(expected) as err:
        await stream.__anext__()
    return err.value


def test_handler_stopping_itself_is_incomplete(nats_url):
    seen = []

    async def handler(request, context):
        yield 1
        context.stop_generating()
        seen.append((context.is_stopped(), context.is_killed()))

    async def main():
        async with ServedEndpoint(nats_url, handler) as h:
            err = await error_after_first_item(h, StreamIncomplete)
            assert str(err).startswith("Stream ended before generation completed")
            assert isinstance(err, ValueError)

    run(main())
    assert seen == [(True, False)]


def test_handler_exception_becomes_value_error(nats_url):
    seen = []

    async def handler(request, context):
        yield 1
        seen.append(context)
        raise RuntimeError("boom")

    async def main():
        async with ServedEndpoint(nats_url, handler) as h:
            err = await error_after_first_item(h, ValueError)
            assert str(err) == "a python exception was caught while processing the async generator: RuntimeError: boom"
            assert not isinstance(err, StreamIncomplete)

    run(main())
    assert not seen[0].is_stopped() and not seen[0].is_killed()


def test_handler_ignoring_cancellation_is_closed(nats_url):
    closed = []
    state = {}

    async def handler(request):  # never looks at a context
        if request.get("short"):
            yield "short"
            return
        i = 0
        try:
            while True:
                yield i
                i += 1
                await asyncio.sleep(0)
        finally:
            closed.append(i)
            state["closed"].set()

    async def main():
        state["closed"] = asyncio.Event()
        async with ServedEndpoint(nats_url, handler) as h:
            ctx, stream = await h.open()
            await stream.__anext__()
            ctx.kill()
            await state["closed"].wait()
            # The runtime is not kept busy by it: the next request is served.
            assert await collect(await h.client.generate({"short": True}, annotated=False)) == ["short"]

    run(main())
    assert len(closed) == 1


def test_kill_crosses_hops(nats_url):
    inner_seen = {}

    async def main():
        inner_seen["killed"] = asyncio.Event()

        async def inner(request, context):
            inner_seen["id"] = context.id()
            try:
                yield "inner-start"
                await context.killed()
            finally:
                inner_seen["reason"] = context.reason()
                inner_seen["killed"].set()

        async with ServedEndpoint(nats_url, inner) as hin:

            async def outer(request, context):
                stream = await hin.client.generate(request, annotated=False, context=context)
                async for x in stream:
                    yield x

            async with ServedEndpoint(nats_url, outer) as hout:
                ctx = Context("hop-id")
                stream = await hout.client.generate({}, annotated=False, context=ctx)
                assert await stream.__anext__() == "inner-start"
                ctx.kill()
                await inner_seen["killed"].wait()

    run(main())
    assert inner_seen["id"] == "hop-id"
    assert inner_seen["reason"] == "kill"


def test_no_responders(nats_url):
    async def handler(request):
        yield 1

    async def main():
        async with ServedEndpoint(nats_url, handler) as h:
            with pytest.raises(NoResponders):
                await h.client.direct({}, 12345)

    run(main())


def test_errors_are_exceptions(nats_url):
    async def main():
        rt = DistributedRuntime(nats_url=nats_url)
        ep = rt.endpoint(f"{new_namespace('t')}.c.e")
        with pytest.raises(TypeError):

            async def not_a_generator(request):
                return 1

            await ep.serve_endpoint(not_a_generator)
        client = await ep.client()
        with pytest.raises(TypeError):
            await client.generate({"x": object()})
        # The migration limit's range is checked once, by the library.
        client.migration_limit = 2
        for bad in (-1, "2", 1.5):
            with pytest.raises(ValueError, match="migration_limit must be an int >= 0"):
                client.migration_limit = bad
        assert client.migration_limit == 2
        with pytest.raises(ValueError, match="migration_limit"):
            await ep.client(migration_limit=-3)
        with pytest.raises(ValueError):
            rt.endpoint("only.two")
        with pytest.raises(ValueError):
            rt.namespace("bad name")
        rt.shutdown()
        with pytest.raises(RuntimeClosed):
            await client.generate({})
        with pytest.raises(RuntimeClosed):
            await ep.client()

    run(main())


# --- across processes -----------------------------------------------------------


def unique_path():
    return f"{new_namespace('proc')}.worker.generate"


@contextlib.asynccontextmanager
async def ready_worker(nats_url):
    """plane_worker.py serving a fresh path, once it is ready: yields
    (worker, path); the worker is SIGKILLed at the end."""
    path = unique_path()
    worker = start_script(HERE / "plane_worker.py", path, nats_url=nats_url)
    try:
        await worker.event_async("ready")
        yield worker, path
    finally:
        worker.kill()


def test_remote_kill_and_stop(nats_url):
    async def main():
        async with ready_worker(nats_url) as (worker, path):
            rt = DistributedRuntime(nats_url=nats_url)
            client = await rt.endpoint(path).client()
            await client.wait_for_instances()

            assert await collect(await client.generate({"mode": "count", "n": 5}, annotated=False)) == list(range(5))

            ctx = Context("remote-kill")
            stream = await client.generate({"mode": "wait_kill"}, annotated=False, context=ctx)
            assert await stream.__anext__() == 0
            ctx.kill()
            ev = await worker.event_async("killed")
            assert (ev["id"], ev["reason"], ev["stopped"]) == ("remote-kill", "kill", True)
            rt.shutdown()

    run(main())


def test_caller_death_kills_handler_with_connection_lost(nats_url):
    async def main():
        async with ready_worker(nats_url) as (worker, path):
            caller = start_script(HERE / "plane_caller.py", path, json.dumps({"mode": "wait_kill"}), nats_url=nats_url)
            await caller.event_async("item")
            caller.kill()
            ev = await worker.event_async("killed")
            assert (ev["id"], ev["reason"]) == ("caller-req", "connection_lost")

    run(main())


def test_worker_death_breaks_stream_and_instance_disappears(nats_url):
    async def main():
        path = unique_path()
        worker = start_script(HERE / "plane_worker.py", path, nats_url=nats_url)
        ready = await worker.event_async("ready")
        rt = DistributedRuntime(nats_url=nats_url)
        client = await rt.endpoint(path).client()
        t0 = time.monotonic()
        assert await client.wait_for_instances() == [ready["instance"]]
        appeared = time.monotonic() - t0

        stream = await client.generate({"mode": "forever"}, annotated=False)
        assert await stream.__anext__() == 0
        worker.kill()
        with pytest.raises(StreamIncomplete, match="^Stream ended before generation completed"):
            async for _ in stream:
                pass

        # The dead instance fails fast, then leaves discovery.
        with pytest.raises(NoResponders):
            await client.direct({"mode": "count"}, ready["instance"])
        t1 = time.monotonic()
        while client.instance_ids():
            assert time.monotonic() - t1 < 15, "dead instance still listed"
            await asyncio.sleep(0.05)
        gone = time.monotonic() - t1
        print(f"instance appeared after {appeared:.3f}s, disappeared {gone:.3f}s after SIGKILL")
        rt.shutdown()

    run(main())


_DEFAULT_SCRIPT = (
    "import asyncio, sys\n"
    "from dynamo_ctx import DistributedRuntime\n"
    "async def handler(request):\n"
    "    yield 'hello from the embedded default'\n"
    "async def main():\n"
    "    rt = DistributedRuntime()\n"
    "    print(rt.nats_url, flush=True)\n"
    "    ep = rt.endpoint('embedded.default.generate')\n"
    "    if sys.argv[1] == 'serve':\n"
    "        t = asyncio.ensure_future(ep.serve_endpoint(handler))\n"
    "        await ep.serving()\n"
    "        print('serving', flush=True)\n"
    "        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)\n"
    "        rt.shutdown(); await t\n"
    "    else:\n"
    "        c = await ep.client(); await c.wait_for_instances()\n"
    "        print([x.data() async for x in await c.generate({})][0], flush=True)\n"
    "        rt.shutdown()\n"
    "asyncio.run(main())\n"
)

# Runs in its own process: the first child hosts NATS at the default address,
# the second joins it. Exit status 0 when both saw what they should. It starts its
# two children itself, not through the harness: it is one command run inside a
# private network namespace (below), where only the interpreter's own modules are at hand.
_DEFAULT_DRIVER = """
import subprocess, sys
script = sys.argv[1]
server = subprocess.Popen([sys.executable, "-c", script, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
try:
    url = server.stdout.readline().strip()
    assert url == "nats://127.0.0.1:4222", url
    assert server.stdout.readline().strip() == "serving"
    out = subprocess.run([sys.executable, "-c", script, "call"], stdout=subprocess.PIPE, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.split("\\n")[:2] == ["nats://127.0.0.1:4222", "hello from the embedded default"], out.stdout
    server.stdin.write("\\n"); server.stdin.flush()
    assert server.wait(60) == 0
    print("ok")
finally:
    if server.poll() is None:
        server.kill()
"""


def test_embedded_default_is_shared_by_processes(tmp_path):
    """With no NATS_SERVER, the first process hosts NATS on 127.0.0.1:4222 and the next joins it.

    Run in a private network namespace where the machine allows one, so that
    suites and demos running beside this one keep their 4222; otherwise only
    when nothing answers at 4222."""
    import socket

    env = child_env(DYNAMO_CTX_RUNTIME_DIR=str(tmp_path / "rt"))  # no NATS_SERVER
    prefix = private_network()
    if not prefix:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", 4222)) == 0:
                pytest.skip("127.0.0.1:4222 is in use and no private network namespace is available")
    r = run_python("-c", _DEFAULT_DRIVER, _DEFAULT_SCRIPT, env=env, prefix=prefix, timeout=2 * HANG)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_frozen_callers_deadline_fires_on_the_worker(nats_url):
    """A caller with a deadline, frozen (SIGSTOP) mid-stream: no kill can come from it, and
    the worker's handler is killed with reason deadline by the worker's own timer."""

    async def main():
        async with ready_worker(nats_url) as (worker, path):
            caller = start_script(HERE / "plane_caller.py", path, json.dumps({"mode": "wait_kill"}), "1.5", nats_url=nats_url)
            try:
                await caller.event_async("item")
                caller.freeze()
                t0 = time.monotonic()
                ev = await worker.event_async("killed")
                assert (ev["id"], ev["reason"]) == ("caller-req", "deadline")
                assert time.monotonic() - t0 < 1.5 + 5, "within the deadline plus a generous bound"
            finally:
                caller.thaw()
                caller.kill()

    run(main())
