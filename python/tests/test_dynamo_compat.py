"""Dynamo compatibility (docs/dynamo-compat.md): each row of its table, exercised
the way Dynamo's own Python tests exercise it, with dynamo_ctx's imports."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
from pathlib import Path
from unittest import mock

import pytest

import dynamo_ctx
from dynamo_ctx import (
    BackendCancelled,
    Context,
    DistributedRuntime,
    HandlerError,
    StreamIncomplete,
)
from dynamo_ctx import runtime as runtime_mod
from dynamo_ctx.runtime import dynamo_worker
from harness import HANG, new_namespace, start_script
from helpers import run

HERE = Path(__file__).resolve().parent


class MockServer:
    """A handler object like the one Dynamo's cancellation tests serve: the
    request names the behaviour, and what the context saw is recorded."""

    def __init__(self) -> None:
        self.stopped = self.killed = False
        self.metadata: dict = {}
        self.done = asyncio.Event()

    async def generate(self, request, context):
        self.stopped = self.killed = False
        self.done.clear()
        try:
            async for item in getattr(self, request)(context):
                yield item
        finally:
            self.done.set()

    def _record(self, context) -> None:
        self.stopped, self.killed = context.is_stopped(), context.is_killed()
        self.metadata = dict(context.metadata.items())

    async def until_stopped_then_raise_cancelled(self, context):
        for i in range(1000):
            if context.is_stopped():
                self._record(context)
                raise asyncio.CancelledError
            await asyncio.sleep(0.02)
            yield i

    async def until_stopped_then_raise_error(self, context):
        for i in range(1000):
            if context.is_stopped():
                self._record(context)
                raise RuntimeError("late failure")
            await asyncio.sleep(0.02)
            yield i

    async def with_metadata(self, context):
        for i in range(1000):
            context.metadata["iteration"] = str(i)
            if context.is_stopped():
                self._record(context)
                return
            await asyncio.sleep(0.02)
            yield {"i": i, "metadata": dict(context.metadata.items())}

    async def stop_itself(self, context):
        for i in range(2):
            yield i
        context.stop_generating()
        self._record(context)

    async def raise_runtime_error(self, context):
        yield 0
        raise RuntimeError("boom")


async def serve_mock(runtime, ns):
    handler = MockServer()
    endpoint = runtime.endpoint(f"{ns}.backend.generate")
    task = asyncio.ensure_future(endpoint.serve_endpoint(handler.generate))
    await endpoint.serving()
    client = await runtime.endpoint(f"{ns}.backend.generate").client()
    await client.wait_for_instances()
    return handler, task, client


async def stop_serving(task):
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def mock_served(nats_url, *args):
    """A runtime made as Dynamo's tests make one (``args`` after the loop)
    serving a MockServer on a fresh namespace; yields (handler, client). The
    endpoint stops at the end (when the body succeeded) and the runtime shuts
    down."""
    runtime = DistributedRuntime(asyncio.get_running_loop(), *args, nats_url=nats_url)
    try:
        handler, task, client = await serve_mock(runtime, new_namespace("compat"))
        yield handler, client
        await stop_serving(task)
    finally:
        runtime.shutdown()


# --- constructors and names -------------------------------------------------


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((True,), {}),  # Dynamo 0.5: DistributedRuntime(loop, is_static)
        ((False,), {}),
        (("etcd", "tcp"), {}),  # Dynamo 1.x: DistributedRuntime(loop, discovery_backend, request_plane)
        (("kubernetes", "http"), {}),
        (("file", "nats", True), {}),  # ... and enable_nats
        ((), {"discovery_backend": "mem", "request_plane": "nats"}),
        ((), {"is_static": True}),
    ],
)
def test_constructor_forms_serve_and_call(nats_url, args, kwargs):
    async def main():
        loop = asyncio.get_running_loop()
        with mock.patch.dict(os.environ, {"NATS_SERVER": nats_url}):
            runtime = DistributedRuntime(loop, *args, **kwargs)
        try:
            assert runtime.nats_url == nats_url
            handler, task, client = await serve_mock(runtime, new_namespace("compat"))
            stream = await client.generate("raise_runtime_error")
            with pytest.raises(HandlerError):
                async for _ in stream:
                    pass
            await stop_serving(task)
        finally:
            runtime.shutdown()

    run(main())


@pytest.mark.parametrize(
    "args,kwargs,exc,words",
    [
        (("zookeeper", "tcp"), {}, ValueError, "unknown discovery_backend 'zookeeper'"),
        (("etcd", "grpc"), {}, ValueError, "unknown request_plane 'grpc'"),
        ((), {"request_plane": "udp"}, ValueError, "unknown request_plane 'udp'"),
        ((1,), {}, TypeError, "is_static must be a bool"),
        (("etcd", "tcp", "yes"), {}, TypeError, "enable_nats must be a bool"),
        (("etcd", "tcp", True, 4), {}, TypeError, "at most 4 positional"),
        (("etcd",), {"discovery_backend": "etcd"}, TypeError, "both by position and by keyword"),
    ],
)
def test_constructor_rejects_unknown_values(args, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        DistributedRuntime(None, *args, **kwargs)


def test_constructor_rejects_a_missing_loop():
    # DistributedRuntime("etcd", "tcp"): the loop was forgotten.
    with pytest.raises(TypeError, match="loop must be an asyncio event loop"):
        DistributedRuntime("etcd", "tcp")


def test_constructor_values_logged_once_at_debug(nats_url, caplog):
    caplog.set_level(logging.DEBUG, logger="dynamo_ctx")
    runtime_mod._logged_values.clear()
    for _ in range(2):
        DistributedRuntime(None, "etcd", "tcp", nats_url=nats_url).shutdown()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "has no meaning here" in r.getMessage()]
    assert sum("discovery_backend='etcd'" in m for m in lines) == 1
    assert sum("request_plane='tcp'" in m for m in lines) == 1


def _params(f):
    return [p for p in inspect.signature(f).parameters if p != "self"]


def test_public_names_have_dynamos_call_shapes():
    # The names a Dynamo backend calls to serve, call and cancel requests;
    # the absent ones are listed in docs/dynamo-compat.md with the reason.
    for name in ("id", "is_stopped", "is_killed", "stop_generating", "kill", "async_killed_or_stopped", "link_child", "child"):
        assert callable(getattr(Context, name)), name
    assert _params(Context.__new__)[1:3] == ["id", "metadata"]  # Dynamo's, in its order (timeout= is ours, after them)
    ctx = Context("req-1")
    assert (ctx.trace_id, ctx.span_id, ctx.parent_span_id) == (None, None, None)
    assert _params(DistributedRuntime.endpoint) == ["path"]
    for name in ("namespace", "shutdown"):
        assert callable(getattr(DistributedRuntime, name))
    assert callable(dynamo_ctx.Namespace.component)
    assert callable(dynamo_ctx.Component.endpoint) and callable(dynamo_ctx.Component.create_service)
    assert _params(dynamo_ctx.Endpoint.serve_endpoint)[:4] == ["handler", "graceful_shutdown", "metrics_labels", "health_check_payload"]
    assert "router_mode" in _params(dynamo_ctx.Endpoint.client)
    assert callable(dynamo_ctx.Endpoint.connection_id)
    for name in ("generate", "round_robin", "random"):
        assert _params(getattr(dynamo_ctx.Client, name)) == ["request", "annotated", "context"], name
    assert _params(dynamo_ctx.Client.direct) == ["request", "instance_id", "annotated", "context"]
    assert _params(dynamo_ctx.Client.instance_ids) == []
    assert inspect.iscoroutinefunction(dynamo_ctx.Client.wait_for_instances)
    assert _params(dynamo_worker) == ["enable_nats", "register_shutdown", "static"]
    assert inspect.signature(dynamo_worker).parameters["register_shutdown"].default is False
    # `from dynamo.runtime import ...` becomes `from dynamo_ctx.runtime import ...`
    for name in ("Client", "Component", "Context", "DistributedRuntime", "Endpoint", "Namespace", "dynamo_worker"):
        assert hasattr(runtime_mod, name), name


def test_endpoint_path_forms_component_and_connection_id(nats_url):
    async def main():
        runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", "tcp", nats_url=nats_url)
        try:
            ns = new_namespace("compat")
            ep = runtime.endpoint(f"dyn://{ns}.backend.generate")
            assert ep.path == f"{ns}.backend.generate"
            assert ep.component() is ep.component and ep.component().name == "backend"
            with pytest.raises(RuntimeError, match="not being served"):
                ep.connection_id()
            handler = MockServer()
            task = asyncio.ensure_future(ep.serve_endpoint(handler.generate))
            instance = await ep.serving()
            assert ep.connection_id() == instance == await ep.lease_id()
            assert runtime.etcd_client() is None
            client = await runtime.endpoint(f"{ns}.backend.generate").client()
            assert await client.wait_for_instances() == [instance] == client.instance_ids()
            with pytest.raises(ValueError, match="router_mode"):
                await ep.client(router_mode="kv")
            await stop_serving(task)
        finally:
            runtime.shutdown()

    run(main())


# --- metadata ---------------------------------------------------------------


def test_metadata_is_a_live_mutable_mapping():
    ctx = Context(id="req-1", metadata={"tenant": "alpha", "region": "us-west"})
    assert ctx.metadata.pop("tenant", None) == "alpha"
    assert "tenant" not in ctx.metadata
    ctx.metadata["tenant"] = "beta"
    ctx.metadata["region"] = "us-east"
    assert ctx.metadata.get("region") == "us-east"
    assert dict(ctx.metadata.items()) == {"region": "us-east", "tenant": "beta"}
    ctx.metadata = {"zone": "a"}
    assert dict(ctx.metadata) == {"zone": "a"}
    assert ctx.metadata is ctx.metadata
    given = {"k": "v"}
    ctx = Context(metadata=given)
    ctx.metadata["k2"] = "v2"
    assert given == {"k": "v"}, "the context keeps its own copy"
    assert Context().metadata == {} and Context("x").metadata == {}
    with pytest.raises(TypeError, match="mapping"):
        Context(metadata=[("a", "b")])
    with pytest.raises(TypeError, match="keys must be strings"):
        ctx.metadata = {1: "x"}


def test_metadata_reaches_handler_and_survives_stop(nats_url):
    # As Dynamo's test_client_context_cancel_preserves_metadata: the handler
    # sees the caller's metadata, mutates its own copy, and still has it
    # when it sees the stop.
    async def main():
        async with mock_served(nats_url, "etcd", "nats") as (handler, client):
            ctx = Context(metadata={"tenant": "alpha", "region": "us-west"})
            stream = await client.generate("with_metadata", context=ctx)
            n = 0
            async for item in stream:
                assert item.data() == {"i": n, "metadata": {"tenant": "alpha", "region": "us-west", "iteration": str(n)}}
                if n == 2:
                    ctx.stop_generating()
                n += 1
            await asyncio.wait_for(handler.done.wait(), HANG)
            assert handler.stopped and not handler.killed
            assert handler.metadata["tenant"] == "alpha" and handler.metadata["region"] == "us-west"
            assert ctx.metadata == {"tenant": "alpha", "region": "us-west"}, "the handler's changes stay on its side"
            # Too large to carry: refused before anything is sent.
            with pytest.raises(ValueError, match="metadata"):
                await client.generate("with_metadata", context=Context(metadata={"k": "x" * 20000}))
            with pytest.raises(TypeError, match="JSON"):
                await client.generate("with_metadata", context=Context(metadata={"k": object()}))

    run(main())


async def start_compat_worker(nats_url, ns):
    """compat_worker.py (made with @dynamo_worker) serving namespace ``ns``, once ready."""
    worker = start_script(HERE / "compat_worker.py", ns, nats_url=nats_url)
    await worker.event_async("ready")
    return worker


def test_metadata_across_processes_and_child_requests(nats_url):
    # The caller here; the worker (made with @dynamo_worker) in another
    # process, whose "outer" handler calls its "generate" endpoint with its
    # own context: metadata goes caller -> outer -> generate.
    async def main():
        ns = new_namespace("compat")
        worker = await start_compat_worker(nats_url, ns)
        runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", "tcp", nats_url=nats_url)
        try:
            client = await runtime.endpoint(f"{ns}.backend.outer").client()
            await client.wait_for_instances()
            ctx = Context(id="meta-remote", metadata={"tenant": "alpha"})
            items = [a.data() async for a in await client.generate({"n": 2}, context=ctx)]
            assert [i["i"] for i in items] == [0, 1]
            for item in items:
                assert item["id"] == "meta-remote"
                assert item["pid"] == worker.pid
                assert item["outer_metadata"] == {"tenant": "alpha", "hop": "outer"}
                assert item["metadata"] == {"tenant": "alpha", "hop": "outer", "seen_by": worker.pid}
            assert ctx.metadata == {"tenant": "alpha"}
            # Without metadata, the handler's starts empty.
            items = [a.data() async for a in await client.generate({"n": 1})]
            assert items[0]["metadata"] == {"hop": "outer", "seen_by": worker.pid}
        finally:
            runtime.shutdown()
            worker.kill()

    run(main())


def test_metadata_survives_migration(nats_url):
    # Two worker processes; the one serving the first attempt is SIGKILLed
    # mid-stream; the retry on the other carries the same metadata and id.
    async def main():
        ns = new_namespace("compat")
        workers = [await start_compat_worker(nats_url, ns) for _ in range(2)]
        runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", "tcp", nats_url=nats_url)
        try:
            client = await runtime.endpoint(f"{ns}.backend.generate").client(migration_limit=1)
            while len(client.instance_ids()) < 2:
                await asyncio.sleep(0.01)
            ctx = Context(id="meta-mig", metadata={"tenant": "gamma"})
            stream = await client.generate({"n": 400, "delay": 0.01}, context=ctx)
            pids, killed = [], None
            async for a in stream:
                item = a.data()
                assert item["id"] == "meta-mig"
                assert item["metadata"] == {"tenant": "gamma", "seen_by": item["pid"]}
                pids.append(item["pid"])
                if killed is None:
                    killed = next(w for w in workers if w.pid == item["pid"])
                    killed.kill()
                elif item["pid"] != killed.pid:
                    ctx.stop_generating()
                    break
            assert len(set(pids)) == 2, "the request was retried on the other worker"
        finally:
            runtime.shutdown()
            for w in workers:
                w.kill()

    run(main())


# --- errors after the caller's own cancellation ----------------------------


@pytest.mark.parametrize("behaviour", ["until_stopped_then_raise_cancelled", "until_stopped_then_raise_error"])
def test_handler_raising_after_callers_stop_is_not_surfaced(nats_url, behaviour):
    # Dynamo's handlers raise asyncio.CancelledError once they see the stop;
    # the caller, who stopped, keeps iterating and sees a clean end.
    async def main():
        async with mock_served(nats_url, True) as (handler, client):
            ctx = Context()
            stream = await client.generate(behaviour, context=ctx)
            got = []
            async for item in stream:
                got.append(item.data())
                if len(got) == 2:
                    ctx.stop_generating()
            assert got[:2] == [0, 1]
            await asyncio.wait_for(handler.done.wait(), HANG)
            assert handler.stopped and not handler.killed

    run(main())


def test_handler_raising_after_callers_kill_is_not_surfaced(nats_url):
    async def main():
        async with mock_served(nats_url, True) as (handler, client):
            ctx = Context()
            stream = await client.generate("until_stopped_then_raise_error", context=ctx)
            async for item in stream:
                if item.data() == 1:
                    ctx.kill()
            await asyncio.wait_for(handler.done.wait(), HANG)

    run(main())


@pytest.mark.parametrize("when", ["before_the_call", "before_the_call_is_awaited", "before_the_first_item_is_awaited"])
def test_context_stopped_early_ends_the_stream_silently(nats_url, when):
    # As Dynamo's test_client_context_already_cancelled and
    # test_client_context_cancel_before_await_request: no items, no error;
    # the handler's context is stopped, not killed.
    async def main():
        async with mock_served(nats_url, "mem", "tcp") as (handler, client):
            ctx = Context()
            if when == "before_the_call":
                ctx.stop_generating()
                stream = await client.generate("until_stopped_then_raise_cancelled", context=ctx)
            elif when == "before_the_call_is_awaited":
                pending = client.generate("until_stopped_then_raise_cancelled", context=ctx)
                ctx.stop_generating()
                stream = await pending
            else:
                stream = await client.generate("until_stopped_then_raise_cancelled", context=ctx)
                ctx.stop_generating()
            items = [a.data() async for a in stream]
            if when != "before_the_first_item_is_awaited":
                assert items == []
            await asyncio.wait_for(handler.done.wait(), HANG)
            assert handler.stopped and not handler.killed

    run(main())


def test_errors_have_stable_codes(nats_url):
    # Where Dynamo 1.x words these differently ("Disconnected: Stream ended
    # ...", "BackendCancelled"), callers match the class or code, not text.
    async def main():
        async with mock_served(nats_url, "etcd", "tcp") as (handler, client):
            with pytest.raises(StreamIncomplete) as ei:
                async for _ in await client.generate("stop_itself"):
                    pass
            assert ei.value.code == "disconnected"
            assert str(ei.value).startswith("Stream ended before generation completed")
            assert handler.stopped and not handler.killed
            with pytest.raises(HandlerError) as ei:
                async for _ in await client.generate("raise_runtime_error"):
                    pass
            assert isinstance(ei.value, ValueError) and not isinstance(ei.value, BackendCancelled)
            assert (ei.value.code, ei.value.error_type) == ("handler_error", "RuntimeError")
            assert str(ei.value) == "a python exception was caught while processing the async generator: RuntimeError: boom"

    run(main())


def test_backend_cancelled_is_a_handler_error():
    # What the caller gets when a handler raises CancelledError while its
    # request is live (the message the worker sends for it).
    lib = dynamo_ctx._lib.native()
    msg = "a python exception was caught while processing the async generator: CancelledError: "
    with pytest.raises(BackendCancelled) as ei:
        runtime_mod._raise_for(lib.EHANDLER, msg)
    assert isinstance(ei.value, HandlerError) and isinstance(ei.value, ValueError)
    assert (ei.value.code, ei.value.error_type, str(ei.value)) == ("backend_cancelled", "CancelledError", msg)


# --- dynamo_worker ----------------------------------------------------------


def test_dynamo_worker_gives_a_runtime_and_shuts_it_down(nats_url):
    seen = {}

    # Dynamo 0.5 wrote @dynamo_worker(static=False), 1.x @dynamo_worker(enable_nats=...);
    # the runtime comes from DYN_DISCOVERY_BACKEND / DYN_REQUEST_PLANE.
    @dynamo_worker(enable_nats=False, static=True)
    async def worker(runtime, ns, greeting="hello"):
        seen["runtime"] = runtime
        handler, task, client = await serve_mock(runtime, ns)
        ctx = Context(metadata={"g": greeting})
        async for a in await client.generate("with_metadata", context=ctx):
            ctx.stop_generating()
            first = a.data()
            break
        await stop_serving(task)
        return first

    env = {"NATS_SERVER": nats_url, "DYN_DISCOVERY_BACKEND": "kubernetes", "DYN_REQUEST_PLANE": "nats"}
    with mock.patch.dict(os.environ, env):
        assert run(worker(new_namespace("compat"), greeting="hi")) == {"i": 0, "metadata": {"g": "hi", "iteration": "0"}}
    assert seen["runtime"].is_shutdown(), "the runtime lives as long as the worker function"
    assert worker.__name__ == "worker"

    @dynamo_worker()
    async def bad(runtime):
        raise AssertionError("not reached")

    with mock.patch.dict(os.environ, {"DYN_REQUEST_PLANE": "carrier-pigeon", "NATS_SERVER": nats_url}):
        with pytest.raises(ValueError, match="carrier-pigeon"):
            run(bad())


def test_dynamo_worker_register_shutdown(nats_url):
    @dynamo_worker(register_shutdown=True)
    async def worker(runtime):
        return runtime

    async def main():
        loop = asyncio.get_running_loop()
        with mock.patch.dict(os.environ, {"NATS_SERVER": nats_url}), mock.patch.object(loop, "add_signal_handler") as add:
            runtime = await worker()
        assert {c.args[0] for c in add.call_args_list} == {signal.SIGINT, signal.SIGTERM}
        assert all(c.args[1] == runtime.shutdown for c in add.call_args_list)
        assert runtime.is_shutdown()

    run(main())


def test_native_metadata_calls_reject_bad_handles():
    lib = dynamo_ctx._lib.native()
    with pytest.raises(ValueError, match="dc_request_metadata: .*bad handle"):
        lib.request_metadata(12345)
    with pytest.raises(ValueError, match="dc_client_generate_metadata: .*bad handle"):
        lib.client_generate(12345, b"{}", None, 0, 0, b'{"k": "v"}')
