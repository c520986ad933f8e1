"""asyncio glue: one readiness file descriptor per event loop.

Each running loop that awaits a context gets one event queue in the library
and watches its fd with ``loop.add_reader``. An await registers a watch (a
token) on the context; when Go moves the context to the awaited state it
pushes the token and the fd becomes readable; the loop's reader drains the
tokens and resolves the matching futures. No polling, no Python code on a Go
thread, and any number of waiters, contexts, loops and threads.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from typing import Any, Callable, Dict, Tuple

from ._lib import native

_wakers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker]" = weakref.WeakKeyDictionary()
_wakers_lock = threading.Lock()


class _LoopWaker:
    """The event queue of one loop. It holds no reference to its loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        lib = native()
        self._lib = lib
        self._queue, self._fd = lib.queue_new()
        self._futures: Dict[int, "asyncio.Future[bool]"] = {}
        self._armed: Dict[int, "asyncio.Future[bool]"] = {}  # handle -> pending arm
        self._tokens = itertools.count(1)
        loop.add_reader(self._fd, self._on_ready)
        # When the loop is collected its selector is gone; free the queue (and fd) then.
        weakref.finalize(loop, _free_queue, lib, self._queue)

    def _on_ready(self) -> None:
        for token in self._lib.queue_drain(self._queue):
            fut = self._futures.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_result(True)

    def _register(self, register: Callable[[int], None]) -> "Tuple[int, asyncio.Future[bool]]":
        """A new token and its future, handed to ``register`` (a library call
        that will push the token); undone if that call fails."""
        token = next(self._tokens)
        fut: "asyncio.Future[bool]" = asyncio.get_running_loop().create_future()
        self._futures[token] = fut
        try:
            register(token)
        except BaseException:
            del self._futures[token]
            fut.cancel()
            raise
        return token, fut

    async def wait(self, ctx: Any, state: int) -> bool:
        token, fut = self._register(lambda t: self._lib.watch(ctx, self._queue, state, t))
        try:
            return await fut
        finally:
            if self._futures.pop(token, None) is not None:
                # Cancelled (or timed out) before the context got there.
                self._lib.unwatch(self._queue, token)

    async def arm(self, handle: int) -> None:
        """Wait until the library says the object behind ``handle`` may have progressed.

        The library keeps one pending arm per object, so concurrent waiters on
        one object share it.
        """
        fut = self._armed.get(handle)
        if fut is None or fut.done():
            _, fut = self._register(lambda t: self._lib.arm(handle, self._queue, t))
            self._armed[handle] = fut
            fut.add_done_callback(lambda f, h=handle: self._armed.pop(h, None) if self._armed.get(h) is f else None)
        # Shielded: one waiter being cancelled must not cancel the shared arm.
        await asyncio.shield(fut)


def _free_queue(lib: Any, queue: int) -> None:
    try:
        lib.queue_free(queue)
    except (RuntimeError, ValueError):  # after fork, or already gone
        pass


def _waker() -> _LoopWaker:
    loop = asyncio.get_running_loop()
    waker = _wakers.get(loop)
    if waker is None:
        with _wakers_lock:
            waker = _wakers.get(loop)
            if waker is None:
                waker = _wakers[loop] = _LoopWaker(loop)
    return waker


async def arm(handle: int) -> None:
    """Wait until the object behind a plane handle may have progressed."""
    await _waker().arm(handle)


async def wait_for_state(ctx: Any, state: int) -> bool:
    """Return True once ``ctx`` reaches ``state`` (1 stopped, 2 killed)."""
    if (ctx._state_word() & 0xFF) >= state:
        return True
    return await _waker().wait(ctx, state)
