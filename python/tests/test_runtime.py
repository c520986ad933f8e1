"""The runtime and request plane (docs/design.md, sections 3 and 6), caller and handler in one process.

Cross-process cases are in test_runtime_processes.py.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import uuid

import pytest

from dynamo_ctx import Context, DistributedRuntime, NoResponders, RuntimeClosed, StreamIncomplete
from helpers import HANG, run



class Harness:
    """A runtime serving one endpoint (unique path per test) plus a client of it."""

    def __init__(self, nats_url, handler):
        self.runtime = DistributedRuntime(nats_url=nats_url)
        self.path = f"test{uuid.uuid4().hex[:8]}.backend.generate"
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
        ctx = Context()
        return ctx, await self.client.generate({}, annotated=False, context=ctx)


async def collect(stream):
    return [item async for item in stream]


def test_roundtrip_annotated_and_plain(nats_url):
    async def handler(request):
        for i in range(request["n"]):
            yield {"i": i}

    async def main():
        async with Harness(nats_url, handler) as h:
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
        async with Harness(nats_url, handler) as h:
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
            async with Harness(nats_url, handler) as h:
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
        async with Harness(nats_url, handler) as h:
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
        async with Harness(nats_url, handler) as h:
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
        async with Harness(nats_url, handler) as h:
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
        async with Harness(nats_url, handler) as h:
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
        async with Harness(nats_url, handler) as h:
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
        async with Harness(nats_url, handler) as h:
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
        async with Harness(nats_url, handler) as h:
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
        async with Harness(nats_url, handler) as h:
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

        async with Harness(nats_url, inner) as hin:

            async def outer(request, context):
                stream = await hin.client.generate(request, annotated=False, context=context)
                async for x in stream:
                    yield x

            async with Harness(nats_url, outer) as hout:
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
        async with Harness(nats_url, handler) as h:
            with pytest.raises(NoResponders):
                await h.client.direct({}, 12345)

    run(main())


def test_errors_are_exceptions(nats_url):
    async def main():
        rt = DistributedRuntime(nats_url=nats_url)
        ep = rt.endpoint(f"t{uuid.uuid4().hex[:6]}.c.e")
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


def test_item_encoding_matches_json_dumps():
    """Items are encoded by a cached C encoder: the same bytes as json.dumps,
    and the same TypeError for what JSON cannot carry."""
    import json as _json

    from dynamo_ctx.runtime import _dumps

    values = [0, -7, 2**70, 1.5, "", "é\n\"\\", None, True, False, [], {}, [1, [2, {"a": None}]],
              {"token_ids": [1, 2, 3], "finish_reason": None}, {"ü": ["\u2028", 1e-300]}]
    for v in values:
        assert _dumps(v) == _json.dumps(v, separators=(",", ":"), allow_nan=False).encode()
    cyclic: list = []
    cyclic.append(cyclic)
    for bad in (float("nan"), float("inf"), object(), {1j: 1}, cyclic, {"a": {1, 2}}):
        with pytest.raises(TypeError, match="not JSON-serialisable"):
            _dumps(bad)


def test_items_yielded_without_suspending_are_batched_but_never_held(nats_url):
    """Items a handler yields back to back go to the library together, and
    still: every item yielded before a raise arrives before the error, a lone
    item arrives while the handler waits, and a kill while it waits reaches
    the handler's await (its finally runs)."""
    log = []

    async def handler(request, context):
        mode = request["mode"]
        if mode == "raise":
            for i in range(300):  # more than one batch and than the send buffer
                yield i
            raise RuntimeError("after 300")
        if mode == "lone":
            yield "first"
            try:
                await context.killed()  # the item must not wait for this
            finally:
                log.append("finally")
        if mode == "many-then-wait":
            for i in range(1000):
                yield i
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                log.append("cancelled")
                raise

    class Counter:  # an async iterator that is not an async generator
        def __init__(self):
            self.i = 0

        def __aiter__(self):
            return self

        async def __anext__(self):
            if self.i == 5:
                raise StopAsyncIteration
            self.i += 1
            return self.i

    async def declared(request):  # what the wrapper below says it is
        yield 0

    @functools.wraps(declared)
    def iterator_handler(request):
        return Counter()

    async def main():
        async with Harness(nats_url, handler) as h:
            stream = await h.client.generate({"mode": "raise"}, annotated=False)
            got = []
            with pytest.raises(ValueError, match="after 300"):
                async for x in stream:
                    got.append(x)
            assert got == list(range(300))

            stream = await h.client.generate({"mode": "lone"}, annotated=False)
            assert await asyncio.wait_for(stream.__anext__(), HANG) == "first"
            await stream.aclose()
            for _ in range(200):
                if log:
                    break
                await asyncio.sleep(0.01)
            assert log == ["finally"]

            stream = await h.client.generate({"mode": "many-then-wait"}, annotated=False)
            got = []
            async for x in stream:
                got.append(x)
                if len(got) == 1000:
                    break
            assert got == list(range(1000))
            await stream.aclose()
            for _ in range(200):
                if len(log) == 2:
                    break
                await asyncio.sleep(0.01)
            assert log == ["finally", "cancelled"]

        async with Harness(nats_url, iterator_handler) as h:
            stream = await h.client.generate({}, annotated=False)
            assert await collect(stream) == [1, 2, 3, 4, 5]

    run(main())


def test_items_of_many_requests_cross_together(nats_url):
    """What every handler yields in one turn of the worker's loop goes to the
    library in one call (request_send_multi), each request's items in order;
    a request whose handler keeps yielding gets its items, interleaved with
    the others', complete."""
    from dynamo_ctx import runtime as rt_mod

    go = asyncio.Event()
    calls = []

    async def handler(request, context):
        await go.wait()
        for i in range(request["n"]):
            yield [request["k"], i]
            if i % 7 == 0:
                await asyncio.sleep(0)

    async def main():
        async with Harness(nats_url, handler) as h:
            real = rt_mod._Sends.flush

            def counting(self):
                calls.append(len([b for b in self.pending.values() if b]))
                real(self)

            rt_mod._Sends.flush = counting
            try:
                streams = [await h.client.generate({"k": k, "n": 1 if k < 40 else 300}, annotated=False) for k in range(50)]
                await asyncio.sleep(0.2)  # every request is waiting in its handler
                go.set()
                got = await asyncio.wait_for(asyncio.gather(*[collect(s) for s in streams]), HANG)
            finally:
                rt_mod._Sends.flush = real
        for k, items in enumerate(got):
            assert items == [[k, i] for i in range(1 if k < 40 else 300)]
        assert max(calls) >= 40  # the 40 lone items (and the first of the others) crossed together

    run(main())


def test_send_multi_rejects_bad_input():
    """request_send_multi: a clear error for what is not a list of handles and
    a list of lists of bytes; a bad handle is an error code for its own entry."""
    from dynamo_ctx._lib import native

    lib = native()
    assert lib.request_send_multi([], []) == []
    assert lib.request_send_multi([0, 2**64 - 1], [[b"1"], []]) == [-lib.EBADF, -lib.EBADF]
    for reqs, batches, exc in [
        ((0,), [[b"1"]], TypeError),
        ([0], ([b"1"],), TypeError),
        ([0], [[b"1"], [b"2"]], ValueError),
        (["x"], [[b"1"]], TypeError),
        ([-1], [[b"1"]], OverflowError),
        ([0], [[1]], TypeError),
        ([0], [b"1"], TypeError),
    ]:
        with pytest.raises(exc):
            lib.request_send_multi(reqs, batches)
    with pytest.raises(TypeError):
        lib.request_send_many(0, (b"1",))
    # A turn of a busy loop: more items in all than one request may send in
    # one call is fine (each entry here is its own stale handle's error).
    assert lib.request_send_multi([0] * 600, [[b"1"] * 128] * 600) == [-lib.EBADF] * 600


def test_stream_take_json_is_stream_take_as_one_array(nats_url):
    """stream_take_json gives what stream_take gives, as the text of one JSON
    array; both refuse a bad handle the same way."""
    from dynamo_ctx._lib import native

    lib = native()
    for take in (lib.stream_take, lib.stream_take_json):
        with pytest.raises(ValueError, match="bad handle"):
            take(0)

    async def handler(request):
        for v in [0, "é\u2028\"", {"a": [1.5, None, True]}, [], "x" * 20000]:
            yield v

    async def main():
        async with Harness(nats_url, handler) as h:
            for take in (lib.stream_take, lib.stream_take_json):
                stream = await h.client.generate({}, annotated=False)
                await stream._wait_started()
                got = []
                while True:
                    code, value = take(stream._handle)
                    if code == lib.EAGAIN:
                        await asyncio.sleep(0.01)
                        continue
                    if code != lib.OK:
                        assert code == lib.EOF
                        break
                    got += json.loads(value) if isinstance(value, str) else [json.loads(v) for v in value]
                assert got == [0, "é\u2028\"", {"a": [1.5, None, True]}, [], "x" * 20000]

    run(main())


def test_eager_task():
    """eager_task runs a coroutine at once up to its first suspension: done
    already when it never suspends, a task for the rest otherwise (sends,
    results, exceptions and cancellation reach the coroutine as in a task)."""
    from dynamo_ctx._aio import eager_task

    log = []

    async def sync(x):
        log.append(("sync", x))
        return x * 2

    async def boom():
        raise KeyError("k")

    async def suspends():
        log.append("start")
        try:
            await asyncio.sleep(0.01)
            log.append("resumed")
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            log.append("cancelled")
            raise

    async def main():
        f = eager_task(sync(3))
        assert f.done() and f.result() == 6 and log == [("sync", 3)]
        f = eager_task(boom())
        assert f.done() and isinstance(f.exception(), KeyError)
        t = eager_task(suspends())
        assert log[-1] == "start" and not t.done()
        await asyncio.sleep(0.05)
        assert log[-1] == "resumed"
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert log[-1] == "cancelled"

    run(main())


def test_native_item_encoder_matches_json_dumps():
    """encode_json (the C encoder of common items) gives json.dumps's bytes
    exactly, and None (Python's encoder then) for what it does not cover:
    random values, nested, with the strings, numbers and subclasses that
    json.dumps treats specially."""
    import enum
    import json as _json
    import random

    from dynamo_ctx._lib import native

    enc = native().encode_json

    class IE(enum.IntEnum):
        A = 1

    class S(str):
        pass

    rng = random.Random(13)
    scalars = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**63, 2**70, 1.5, 1e300, "", "abc", 'a"b', "a\\b", "é", "\n",
               "\x7f", "~ ", IE.A, S("s"), "x" * 300]

    def rand(d=0):
        r = rng.random()
        if d > 5 or r < 0.3:
            return rng.choice(scalars + [rng.randrange(-10**6, 10**6), "".join(chr(rng.randrange(0x20, 0x7F)) for _ in range(8))])
        if r < 0.55:
            return [rand(d + 1) for _ in range(rng.randrange(5))]
        if r < 0.7:
            return tuple(rand(d + 1) for _ in range(rng.randrange(4)))
        return {rng.choice(["a", "token_ids", "é", 'q"', 1, S("k")]): rand(d + 1) for _ in range(rng.randrange(5))}

    fast = 0
    for _ in range(20000):
        v = rand()
        got = enc(v)
        if got is not None:
            fast += 1
            assert got == _json.dumps(v, separators=(",", ":"), allow_nan=False).encode(), v
    assert fast > 5000
    assert enc({"token_ids": [1, 2], "finish_reason": None}) == b'{"token_ids":[1,2],"finish_reason":null}'
    cyclic: list = []
    cyclic.append(cyclic)
    deep: list = []
    cur = deep
    for _ in range(100):
        cur.append([])
        cur = cur[0]
    assert enc(cyclic) is None and enc(deep) is None and enc(1.5) is None and enc(object()) is None


def test_send_multi_has_no_limit_across_requests():
    """request_send_multi: the library's bounds on one call (65536 requests,
    65536 items a request) are bounds per request, as they were when each
    request crossed on its own: many requests are not an error of the whole
    call, and a request of too many items is its own entry's error (an error
    of the call leaves every request's items unsent)."""
    from dynamo_ctx._lib import native

    lib = native()
    # 2 x 40000 items: each request's count is within the bound, the sum is not.
    assert lib.request_send_multi([0, 0], [[b"1"] * 40000, [b"1"] * 40000]) == [-lib.EBADF, -lib.EBADF]
    # A request of 65537 items, beside another.
    assert lib.request_send_multi([0, 0], [[b"1"] * 65537, [b"1"]]) == [-lib.EINVAL, -lib.EBADF]
    # 65537 requests of one item each.
    n = (1 << 16) + 1
    assert lib.request_send_multi([0] * n, [[b"1"]] * n) == [-lib.EBADF] * n


def test_a_busy_turn_still_sends_every_request(nats_url):
    """When the handlers of one turn of the loop yield more than 65536 items
    in all (here 520 requests of 127 items, each below _SEND_BATCH), every
    request's items still go out at the end of the turn: none waits for its
    handler's next item or its end."""
    k, per = 520, 127
    go = asyncio.Event()
    got_all = asyncio.Event()

    async def handler(request, context):
        await go.wait()
        for i in range(per):
            yield i
        await got_all.wait()  # the items must not wait for the handler to end

    async def main():
        async with Harness(nats_url, handler) as h:
            streams = [await h.client.generate({"k": j}, annotated=False) for j in range(k)]
            await asyncio.sleep(0.5)  # every request is waiting in its handler
            go.set()

            async def first_items(s):
                out = []
                async for item in s:
                    out.append(item)
                    if len(out) == per:
                        return out
                return out

            try:
                got = await asyncio.wait_for(asyncio.gather(*[first_items(s) for s in streams]), 20)
            finally:
                got_all.set()
            assert all(g == list(range(per)) for g in got)

    run(main())
