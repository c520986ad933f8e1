"""A kill delivered to a handler from within its own step of the loop."""

import asyncio
import threading

from dynamo_ctx import Context, _aio
from dynamo_ctx._lib import native


def test_kill_delivered_inside_the_handlers_own_step_is_delivered_once():
    """deliver_pending (called by _Sends.defer from a handler's step) runs the
    kill rule's callback for the running task itself: the task's cancel is
    then pending, not consumed. If the handler next awaits its context, the
    await raises, and the cleanup's first await must not raise again."""

    async def handler(ctx, out):
        release = _aio.cancel_on_kill(ctx, asyncio.current_task(), asyncio.get_running_loop())
        try:
            t = threading.Thread(target=ctx.kill)
            t.start()
            t.join()
            _aio.deliver_pending()  # what _Sends.defer does every 64 requests
            try:
                await _aio.wait_for_state(ctx, native().KILLED)
            except asyncio.CancelledError:
                out.append("raised")
            try:
                await asyncio.sleep(0)  # cleanup that awaits
                out.append("cleanup ok")
            except asyncio.CancelledError:
                out.append("cleanup cancelled again")
        finally:
            release()

    async def main():
        out = []
        task = asyncio.get_running_loop().create_task(handler(Context("own-step"), out))
        try:
            await task
        except asyncio.CancelledError:
            pass
        return out

    assert asyncio.run(main()) == ["raised", "cleanup ok"]


def test_eager_task_first_step_never_runs_in_the_callers_task():
    """A kill delivered inside another request's step (deliver_pending) may
    start an engine abort with eager_task: its first step must not run as
    that other request's task (a timeout it starts would cancel the wrong
    task). It is its own task, on every version: the one that runs the rest."""
    seen = []

    async def first_step():
        seen.append(asyncio.current_task())
        await asyncio.sleep(0)
        seen.append(asyncio.current_task())
        return 7

    async def caller():
        me = asyncio.current_task()
        fut = _aio.eager_task(first_step())
        assert asyncio.current_task() is me  # the caller's task is current again
        assert await fut == 7
        return me

    me = asyncio.run(caller())
    assert seen[0] is not me and seen[1] is not me and seen[1] is not None
    assert seen[0] is seen[1]


def test_more_wake_ups_than_the_pipe_holds_all_arrive_in_order():
    """The event queue carries its tokens in its pipe (64 KiB: 8,192 of them);
    beyond that they wait in the library. 20,000 contexts killed at once on
    another thread: every waiter wakes, in the order of the kills, with the
    tokens read from the pipe and the rest taken from the library."""
    n = 20_000

    async def main():
        ctxs = [Context(f"many-{i}") for i in range(n)]
        woke = []

        async def waiter(i):
            await ctxs[i].killed()
            woke.append(i)

        tasks = [asyncio.ensure_future(waiter(i)) for i in range(n)]
        await asyncio.sleep(0)  # every waiter is registered
        t = threading.Thread(target=lambda: [c.kill() for c in ctxs])
        t.start()
        t.join()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert woke == list(range(n))

    asyncio.run(main())
