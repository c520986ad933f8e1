"""A kill delivered to a handler from within its own step of the loop."""

import asyncio
import threading

from dynamo_ctx import Context, _aio
from dynamo_ctx.context import KILLED


def test_kill_delivered_inside_the_handlers_own_step_is_delivered_once():
    """deliver_pending (called by _Sends.defer from a handler's step) runs the
    kill rule's callback for the running task itself: the task's cancel is
    then pending, not consumed. If the handler next awaits its context, the
    await raises, and the cleanup's first await must not raise again."""

    async def handler(ctx, out):
        release = _aio.cancel_on_kill(ctx)
        try:
            t = threading.Thread(target=ctx.kill)
            t.start()
            t.join()
            _aio.deliver_pending()  # what _Sends.defer does every 64 requests
            try:
                await _aio.wait_for_state(ctx, KILLED)
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
