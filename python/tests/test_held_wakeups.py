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
