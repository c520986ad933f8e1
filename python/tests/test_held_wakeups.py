"""A kill made on the event loop that runs the killed request's handler (an
in-process request): the handler runs before the library's own threads are
woken (docs/design.md, "In-process kills").

``Context.kill`` cancels with ``dc_context_cancel_held``: the words and the
loop's waiters move at once, the library's thread wake-ups (the Kill frame's
goroutine, the request's writer) are held and run on the loop's next turn,
after the handler's task. These tests check the order (by what run_held
actually ran), that every request still ends and frees what it held, and
that a kill made without a running loop runs them at once.
"""

from __future__ import annotations

import asyncio

from dynamo_ctx import Context
from dynamo_ctx._lib import native
from harness import HANG
from helpers import ServedEndpoint, run

KILLS = 40


class HeldLog:
    """Records, in order, the handler's wake-ups and the runs of the held
    wake-ups (the module's run_held, wrapped)."""

    def __init__(self, monkeypatch):
        self.events: list = []
        mod = native()
        real = mod.run_held

        def run_held(upto: int) -> int:
            ran = real(upto)  # how many cancels' wake-ups ran
            self.events.append(("held ran", ran))
            return ran

        monkeypatch.setattr(mod, "run_held", run_held)


def test_the_in_process_handler_runs_before_the_held_wake_ups(nats_url, monkeypatch):
    log = HeldLog(monkeypatch)

    async def handler(request, context):
        yield 0
        try:
            await context.killed()
        finally:
            log.events.append(("handler woke", context.reason()))

    async def main():
        async with ServedEndpoint(nats_url, handler) as served:
            for i in range(KILLS):
                ctx = Context(f"held-{i}")
                stream = await served.client.generate({}, annotated=False, context=ctx)
                assert await stream.__anext__() == 0
                log.events.clear()
                ctx.kill()
                # The stream ends at once, with nothing more.
                assert [item async for item in stream] == []
                for _ in range(100):
                    if len(log.events) >= 2:
                        break
                    await asyncio.sleep(0.001)
                # The handler first; then this kill's held wake-ups, which
                # nothing ran before (taking from the stream does not).
                assert log.events[:2] == [("handler woke", "kill"), ("held ran", 1)], log.events
            # Every request's handle and the library's own work for it ended.
            for _ in range(int(HANG * 100)):
                if native().handle_counts().get("requests", 0) == 0:
                    break
                await asyncio.sleep(0.01)
            assert native().handle_counts().get("requests", 0) == 0

    run(main())


def test_a_kill_without_a_running_loop_runs_them_at_once(nats_url, monkeypatch):
    """An in-process request killed from a thread that runs no loop (here:
    from a callback of another thread's): nothing would run the held
    wake-ups on a later turn, so the kill runs them before it returns."""
    log = HeldLog(monkeypatch)

    async def handler(request, context):
        yield 0
        await context.killed()

    async def main():
        async with ServedEndpoint(nats_url, handler) as served:
            ctx = Context("held-thread")
            stream = await served.client.generate({}, annotated=False, context=ctx)
            assert await stream.__anext__() == 0
            await asyncio.to_thread(ctx.kill)
            assert log.events == [("held ran", 1)]
            assert [item async for item in stream] == []

    run(main())


def _recording_handler(woke: list):
    """A handler that yields 0, then waits for its kill and appends the
    reason to ``woke``."""

    async def handler(request, context):
        yield 0
        try:
            await context.killed()
        finally:
            woke.append(context.reason())

    return handler


def _kill_in_process(nats_url, monkeypatch, kills: int = 10) -> list:
    """In-process kills, each with the fd reads (the module's queue_read)
    and the tokens handed back to the flush counted across the kill() call;
    the list of those (reads, tokens) pairs."""
    from dynamo_ctx import _aio, _lib

    mod = native()
    reads = []
    handed = []
    real = mod.queue_read

    def queue_read(*args):
        reads.append(1)
        return real(*args)

    def flush(ticket: int = 0, tokens=None, queue: int = 0):
        handed.extend(tokens or [])
        return _aio._flush_local(ticket, tokens, queue)

    monkeypatch.setattr(mod, "queue_read", queue_read)
    if _lib._callbacks.get("local_queue") is not None:
        monkeypatch.setitem(_lib._callbacks, "flush_local", flush)
        mod._register_callbacks(**_lib._callbacks)
    woke: list = []
    handler = _recording_handler(woke)

    async def main():
        counts = []
        async with ServedEndpoint(nats_url, handler) as served:
            for i in range(kills):
                ctx = Context(f"local-{i}")
                stream = await served.client.generate({}, annotated=False, context=ctx)
                assert await stream.__anext__() == 0
                await asyncio.sleep(0.001)
                before, handed_before = len(reads), len(handed)
                ctx.kill()
                counts.append((len(reads) - before, len(handed) - handed_before))
                assert [item async for item in stream] == []
        assert woke == ["kill"] * kills
        return counts

    try:
        return run(main())
    finally:
        monkeypatch.undo()
        mod._register_callbacks(**_lib._callbacks)


def test_an_in_process_kill_delivers_without_reading_the_fd(nats_url, monkeypatch):
    """The tokens the kill fires on the loop's own queue (the handler's
    watches) come back from the library (dc_context_cancel_local) and are
    delivered in the kill() call: the loop's fd is not read for them."""
    counts = _kill_in_process(nats_url, monkeypatch)
    assert all(reads == 0 and handed >= 1 for reads, handed in counts), counts


def test_a_failing_local_queue_leaves_the_tokens_to_the_fd(nats_url, monkeypatch):
    """If asking for the loop's queue fails, the kill goes as before: its
    tokens go through the fd, read at once by the flush; nothing is lost."""
    from dynamo_ctx import _lib

    def broken() -> int:
        raise RuntimeError("no queue")

    mod = native()
    monkeypatch.setitem(_lib._callbacks, "local_queue", broken)
    mod._register_callbacks(**_lib._callbacks)
    counts = _kill_in_process(nats_url, monkeypatch)  # undoes the patch when done
    assert all(reads >= 1 and handed == 0 for reads, handed in counts), counts


def test_a_keyboard_interrupt_in_the_queue_lookup_is_raised_before_the_cancel(monkeypatch):
    """A KeyboardInterrupt raised while the kill asks for the loop's queue
    (a signal's handler ran then) is not swallowed: kill() raises it, and
    has cancelled nothing."""
    from dynamo_ctx import _lib

    def interrupted() -> int:
        raise KeyboardInterrupt

    mod = native()
    ctx = Context("interrupted")
    ctx.child()  # a Go side: the cancel goes to the library
    monkeypatch.setitem(_lib._callbacks, "local_queue", interrupted)
    mod._register_callbacks(**_lib._callbacks)
    try:
        try:
            ctx.kill()
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("kill() swallowed the KeyboardInterrupt")
        assert not ctx.is_killed()
    finally:
        monkeypatch.undo()
        mod._register_callbacks(**_lib._callbacks)
    ctx.kill()
    assert ctx.is_killed()


def test_a_failing_flush_gives_the_tokens_back_to_the_fd(nats_url, monkeypatch):
    """If the flush that should deliver the handed-back tokens fails before
    delivering, the tokens go to the fd: the handler still wakes."""
    from dynamo_ctx import _aio, _lib

    mod = native()
    failed = []

    def flush(ticket: int = 0, tokens=None, queue: int = 0):
        if tokens is not None:
            failed.append(len(tokens))
            raise RuntimeError("flush failed")
        return _aio._flush_local(ticket)

    monkeypatch.setitem(_lib._callbacks, "flush_local", flush)
    mod._register_callbacks(**_lib._callbacks)
    woke: list = []
    handler = _recording_handler(woke)

    async def main():
        async with ServedEndpoint(nats_url, handler) as served:
            ctx = Context("flush-fails")
            stream = await served.client.generate({}, annotated=False, context=ctx)
            assert await stream.__anext__() == 0
            await asyncio.sleep(0.001)
            try:
                ctx.kill()
            except RuntimeError as e:
                assert str(e) == "flush failed"
            assert ctx.is_killed()
            assert [item async for item in stream] == []
            for _ in range(int(HANG * 100)):
                if woke:
                    break
                await asyncio.sleep(0.01)

    try:
        run(main())
    finally:
        monkeypatch.undo()
        mod._register_callbacks(**_lib._callbacks)
        native().run_held(2**64 - 1)
    assert failed and failed[0] >= 1
    assert woke == ["kill"]
