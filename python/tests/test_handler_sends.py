"""A handler's items on their way to the caller: encoded (by the C encoder or json's, the
same bytes), batched per turn of the worker's loop but never held, sent through the
native calls (request_send_multi, stream_take_json), the eager handler task; items a
handler yielded before it failed; and the loop _Sends keeps. The first tests serve a
handler through a runtime; the last ones drive _Sends with a fake library."""

from __future__ import annotations

import asyncio
import functools
import json

import pytest

from dynamo_ctx import Context
from dynamo_ctx import serving as rt_mod
from dynamo_ctx._aio import handler_task
from dynamo_ctx._lib import native
from harness import HANG
from helpers import ServedEndpoint, collect, run


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
        async with ServedEndpoint(nats_url, handler) as h:
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

        async with ServedEndpoint(nats_url, iterator_handler) as h:
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
        async with ServedEndpoint(nats_url, handler) as h:
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


@pytest.mark.parametrize("name", ["request_send_multi", "request_post_multi"])
def test_send_multi_rejects_bad_input(name):
    """request_send_multi, and request_post_multi before it posts anything: a
    clear error for what is not a list of handles and a list of lists of
    bytes. A bad handle is an error code for its own entry in the call; a
    post takes it (the library drops what it posted to a handle freed
    meanwhile)."""
    from dynamo_ctx._lib import native

    lib = native()
    send_multi = getattr(lib, name)
    assert send_multi([], []) == []
    bad = [1, 0] if name == "request_post_multi" else [-lib.EBADF, -lib.EBADF]
    assert send_multi([0, 2**64 - 1], [[b"1"], []]) == bad
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
            send_multi(reqs, batches)
    with pytest.raises(TypeError):
        lib.request_send_many(0, (b"1",))
    # A turn of a busy loop: more items in all than one request may send in
    # one call is fine (each entry here is its own stale handle's error), and
    # more than one message holds is posted in several.
    many = send_multi([0] * 600, [[b"1"] * 128] * 600)
    assert many == ([128] * 600 if name == "request_post_multi" else [-lib.EBADF] * 600)
    # Larger than a message: by the call.
    if name == "request_post_multi":
        big = b'"' + b"x" * lib.POST_MAX_MESSAGE + b'"'
        assert send_multi([0], [[big]]) == [-lib.EBADF]


def test_posted_tick_and_load_check_their_arguments():
    """post_host_tick and post_engine_load: what the call refuses is refused
    as the call refuses it (a handle is the library's to check, later: a
    freed one is ignored)."""
    lib = native()
    assert lib.post_host_tick(0) is None
    assert lib.post_engine_load(0, 1, 0.5) is None
    for args, exc in [((0, 1, float("nan")), ValueError), (("x", 1, 0.5), TypeError), ((0, 1), TypeError)]:
        with pytest.raises(exc):
            lib.post_engine_load(*args)
    with pytest.raises(OverflowError):
        lib.post_host_tick(-1)


def test_posted_items_wait_for_a_caller_that_does_not_read(nats_url):
    """Items posted at the end of each turn (request_post_multi) reach the
    caller once each, in order, and a caller that stops reading holds its
    handler back: once its request's buffer is over the bound the library
    lists it as full, its items go by the call again, which refuses them,
    and its handler waits; another request, read all along, finishes
    meanwhile (request-plane.md, "Credits and bounded buffers")."""
    total, per_turn = 6000, 40
    made = {"slow": [], "fast": []}

    async def handler(request, context):
        mine = made[request["who"]]
        for i in range(total):
            mine.append(i)
            yield i
            if i % per_turn == per_turn - 1:
                await asyncio.sleep(0)  # the turn ends: this turn's items are posted

    async def main():
        async with ServedEndpoint(nats_url, handler) as h:
            slow = await h.client.generate({"who": "slow"}, annotated=False)
            first = await asyncio.wait_for(slow.__anext__(), HANG)
            fast = await h.client.generate({"who": "fast"}, annotated=False)
            fast_items = await asyncio.wait_for(collect(fast), HANG)  # while the slow caller reads nothing
            await asyncio.sleep(0.3)
            held_back = len(made["slow"])
            got = [first] + await asyncio.wait_for(collect(slow), HANG)
        assert fast_items == list(range(total))
        assert got == list(range(total))
        assert held_back < total // 2, held_back

    run(main())


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
        async with ServedEndpoint(nats_url, handler) as h:
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


def test_a_busy_turn_sends_every_request(nats_url):
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
        async with ServedEndpoint(nats_url, handler) as h:
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


# --- _Sends with a fake library ------------------------------------------------


class FakeLib:
    """The request half of the library, with a send buffer of ``room`` items
    that the caller drains when told to."""

    def __init__(self, room):
        self.room = room
        self.sent = []
        self.end = None
        self.ctx = Context("fake")
        self.encode_json = native().encode_json

    def request_context(self, req, cls):
        return self.ctx

    def request_payload(self, req):
        return b"{}"

    def request_metadata(self, req):
        return None

    def _take(self, batch):
        if self.end is not None:  # finished: dropped silently, all taken
            return len(batch)
        n = min(len(batch), self.room)
        self.room -= n
        self.sent += batch[:n]
        return n

    def request_send_multi(self, reqs, batches):
        return [self._take(b) for b in batches]

    request_post_multi = request_send_multi  # a post's answers are the call's (the library's fallback)

    def request_send_many(self, req, batch):
        return self._take(batch)

    def request_complete(self, req):
        self.end = ("complete",)

    def request_fail(self, req, msg):
        self.end = ("fail", msg)

    def request_free(self, req):
        pass


@pytest.mark.parametrize("exc", [RuntimeError, asyncio.CancelledError])
def test_items_yielded_before_a_handler_error_all_go_out(monkeypatch, exc):
    """Whatever the handler raises, what it yielded before goes out before
    the error: the RuntimeError path waits for room (_send_all); the path of
    a CancelledError the handler raised itself only sends what fits now and
    drops the rest (and cancels the drain that would have sent it)."""
    armed = []

    async def arm(req):
        fut = asyncio.get_running_loop().create_future()
        armed.append(fut)
        await fut

    monkeypatch.setattr(rt_mod, "arm", arm)
    lib = FakeLib(room=4)

    async def handler(request):
        for i in range(10):
            yield i
        await asyncio.sleep(0)  # end of the turn: 4 taken, 6 left to drain
        if exc is asyncio.CancelledError:
            fut = asyncio.get_running_loop().create_future()
            fut.cancel()
            await fut  # an inner future was cancelled: the handler's own CancelledError
        raise exc("boom")

    async def main():
        loop = asyncio.get_running_loop()
        task = handler_task(rt_mod._serve_one(lib, 1, handler, False, loop), loop)
        for _ in range(20):
            await asyncio.sleep(0)
            if armed:  # the caller reads: room for everything
                lib.room = 100
                for f in armed:
                    if not f.done():
                        f.set_result(None)
                armed.clear()
        await asyncio.wait_for(task, 2)

    run(main())
    assert lib.end and lib.end[0] == "fail"
    assert [int(x) for x in lib.sent] == list(range(10)), f"sent {lib.sent} before {lib.end}"


def test_a_finished_loop_is_not_kept_alive_by_the_sends_of_its_thread():
    """_local.sends held its loop strongly: a finished loop, its event queue
    and fd lived on until the thread ran another loop."""
    import gc
    import weakref

    from dynamo_ctx import _aio

    refs = []

    async def main():
        refs.append(weakref.ref(asyncio.get_running_loop()))
        rt_mod._sends_of_loop(native(), asyncio.get_running_loop())
        _aio._waker()

    asyncio.run(main())
    gc.collect()
    assert refs[0]() is None


def test_deliver_pending_runs_what_a_kill_queued_within_the_turn():
    """A kill from another thread, while the loop is busy in one callback,
    reaches an on_stopped callback when that code calls deliver_pending,
    not only after the loop next polls its fd."""
    import threading

    from dynamo_ctx import _aio

    async def main():
        ctx = Context("deliver-pending")
        seen = []
        _aio.on_stopped(ctx, lambda: seen.append(ctx.reason()))
        _aio.deliver_pending()  # nothing queued: nothing runs
        assert seen == []
        t = threading.Thread(target=ctx.kill)
        t.start()
        t.join()
        assert seen == []  # queued for the loop, which has not polled since
        _aio.deliver_pending()
        assert seen == ["kill"]
        _aio.deliver_pending()  # delivered once
        assert seen == ["kill"]

    run(main())


def test_sends_deliver_pending_every_so_many_requests_of_a_turn(monkeypatch):
    """_Sends.defer calls deliver_pending every DELIVER_EVERY requests it
    defers in one turn of the loop (a decode step's tokens of many streams)."""
    calls = []
    monkeypatch.setattr(rt_mod, "deliver_pending", lambda: calls.append(1))
    every = rt_mod._Sends.DELIVER_EVERY

    async def main():
        sends = rt_mod._Sends(FakeLib(room=10**6), asyncio.get_running_loop())
        for req in range(every * 3 - 1):
            sends.defer(req, [b"1"])
        assert len(calls) == 2
        await asyncio.sleep(0)  # the turn ends: flushed, the count starts again
        for req in range(every - 1):
            sends.defer(req, [b"1"])
        assert len(calls) == 2
        sends.defer(every, [b"1"])
        assert len(calls) == 3

    run(main())


def test_items_refused_by_a_full_buffer_go_out_while_the_handler_waits(monkeypatch):
    """What a full buffer refused at the end of a turn goes out as soon as
    the request can take more, not with the handler's next item (which may
    never come); once the request ends (drop) nothing more is sent for it."""
    lib = FakeLib(room=4)
    writable = []

    async def arm(req):  # the library's "may take more now"
        fut = asyncio.get_running_loop().create_future()
        writable.append(fut)
        await fut

    monkeypatch.setattr(rt_mod, "arm", arm)

    async def main():
        sends = rt_mod._Sends(lib, asyncio.get_running_loop())
        batch = [b"%d" % i for i in range(10)]
        sends.defer(7, batch)
        await asyncio.sleep(0)  # the end of the turn: 4 taken, 6 refused
        await asyncio.sleep(0)
        assert lib.sent == [b"0", b"1", b"2", b"3"] and len(batch) == 6 and 7 in sends.draining
        lib.room = 3
        writable.pop().set_result(None)
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(lib.sent) == 7 and len(batch) == 3  # still waiting for room
        sends.drop(7)  # the request ended
        for _ in range(3):
            await asyncio.sleep(0)
        assert not sends.draining and len(lib.sent) == 7

    run(main())
