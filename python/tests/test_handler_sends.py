"""Items a handler yielded before it failed, and the loop _Sends keeps (batched sends)."""

from __future__ import annotations

import asyncio

import pytest

from dynamo_ctx import Context
from dynamo_ctx import serving as rt_mod
from dynamo_ctx._aio import handler_task
from dynamo_ctx._lib import native
from helpers import run


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
        task = handler_task(rt_mod._serve_one(lib, 1, handler, False))
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
        rt_mod._sends_of_loop(native())
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
