"""asyncio glue: one readiness file descriptor per event loop.

Each running loop that awaits a context gets one event queue in the library
and watches its fd with ``loop.add_reader``. An await registers a watch (a
token) on the context; when Go moves the context to the awaited state it
writes the token into the fd's pipe; the loop's reader reads the tokens (in
C, without calling into Go) and resolves the matching futures. No polling, no
Python code on a Go thread, and any number of waiters, contexts, loops and
threads.

The states and the state word's layout are the library's (``_native.STOPPED``,
``KILLED``, ``STATE_MASK``), read when needed: importing this module loads
nothing. It imports no module of the package but ``_lib``, so context.py can
import it.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import collections.abc
import threading
import weakref
from typing import Any, Callable, Coroutine, Dict, List, Optional, Set, Tuple

from ._lib import native

_wakers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker]" = weakref.WeakKeyDictionary()
_wakers_lock = threading.Lock()


class _LoopWaker:
    """The event queue of one loop. It holds no reference to its loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        lib = native()
        self._lib = lib
        self._queue, self._fd = lib.queue_new()
        self._drain_after = lib.queue_drain_after(self._queue)  # queue_read's rule
        self._futures: Dict[int, "asyncio.Future[bool]"] = {}
        self._callbacks: Dict[int, Callable[[], object]] = {}  # token -> run when it fires
        self._armed: Dict[int, "asyncio.Future[bool]"] = {}  # handle -> pending arm
        self._tokens = itertools.count(1)
        loop.add_reader(self._fd, self._on_ready)
        # When the loop is collected its selector is gone; free the queue (and fd) then.
        weakref.finalize(loop, _free_queue, lib, self._queue)

    def _on_ready(self) -> None:
        # The tokens come from the fd's pipe, read in C: no call into Go
        # (which from this thread may first wait for a Go P) unless the pipe
        # overflowed.
        self._fire(self._lib.queue_read(self._queue, self._fd, self._drain_after))

    def _fire(self, tokens: "List[int]") -> None:
        """Resolve the futures and run the callbacks of ``tokens``, on the
        loop. A callback that raises (it must not) goes to the loop's
        exception handler, and the other tokens are delivered still."""
        for token in tokens:
            fut = self._futures.pop(token, None)
            if fut is not None:
                if not fut.done():
                    fut.set_result(True)
                continue
            callback = self._callbacks.pop(token, None)
            if callback is not None:
                try:
                    callback()
                except Exception as e:  # noqa: BLE001 - the tokens after it must still be delivered
                    asyncio.get_running_loop().call_exception_handler(
                        {"message": "dynamo_ctx: a state callback raised", "exception": e}
                    )

    def deliver(self, loop: asyncio.AbstractEventLoop, tokens: "Optional[List[int]]" = None) -> None:
        """``_on_ready`` for a caller that is not the fd's reader, on ``loop``
        (this waker's), or ``_fire(tokens)`` for tokens the library handed
        back instead of writing them to the fd: never raises (an error goes
        to the loop's exception handler, and the fd's callback delivers what
        is left in the fd)."""
        try:
            if tokens is None:
                self._on_ready()
            else:
                self._fire(tokens)
        except Exception as e:  # noqa: BLE001 - whatever called this must not fail for it
            loop.call_exception_handler({"message": "dynamo_ctx: delivering queued events failed", "exception": e})

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

    def on_state(self, ctx: Any, state: int, callback: Callable[[], object]) -> Callable[[], None]:
        """Run ``callback`` on the loop (synchronously, in the reader) once
        ``ctx`` reaches ``state``; return a function that cancels this."""
        token = next(self._tokens)
        self._callbacks[token] = callback
        try:
            self._lib.watch(ctx, self._queue, state, token)
        except BaseException:
            del self._callbacks[token]
            raise

        def cancel() -> None:
            if self._callbacks.pop(token, None) is not None:
                try:
                    self._lib.unwatch(self._queue, token)
                except (RuntimeError, ValueError):  # already fired, or the queue is gone
                    pass

        return cancel

    async def arm(self, handle: int) -> None:
        """Wait until the library says the object behind ``handle`` may have progressed.

        The library keeps one pending arm per object, so concurrent waiters on
        one object share it.
        """
        fut = self._armed.get(handle)
        if fut is None or fut.done():
            _, fut = self._register(lambda t: self._lib.arm(handle, self._queue, t))
            self._armed[handle] = fut

            def forget(f: "asyncio.Future[Any]", h: int = handle) -> None:
                if self._armed.get(h) is f:
                    self._armed.pop(h, None)

            fut.add_done_callback(forget)
        # Shielded: one waiter being cancelled must not cancel the shared arm.
        await asyncio.shield(fut)


def _free_queue(lib: Any, queue: int) -> None:
    try:
        lib.queue_free(queue)
    except (RuntimeError, ValueError):  # after fork, or already gone
        pass


def _local_queue() -> int:
    """The event queue of this thread's running loop, 0 for none: registered
    with the native module, which asks before a cancel made by this thread,
    so that the tokens the cancel fires on that queue come back to
    ``_flush_local`` instead of going through the fd (a write and a read
    less for an in-process kill)."""
    waker = _running_waker()[1]
    return 0 if waker is None else waker._queue


def _flush_local(ticket: int = 0, tokens: "Optional[List[int]]" = None, queue: int = 0) -> Optional[bool]:
    """Called by the native module right after this thread cancelled a
    context (the package's ``__init__`` tells ``_lib`` of it, which registers
    it). If the thread runs an event loop with an event queue, what the
    cancellation woke there (the futures and callbacks of an in-process
    handler or waiter) is delivered now instead of after the loop's next poll
    of the fd: one wake-up less for an in-process kill. ``tokens`` (not
    None): what the cancel fired on ``queue``, the one ``_local_queue``
    named, handed back rather than written to the fd; they are delivered,
    the fd is not read (what it holds comes at the loop's next poll). False
    when no waker of ``queue`` runs here to take them: the module gives them
    back to the fd.

    ``ticket`` (not 0): the library held the wake-ups of its own threads that
    the cancel caused (``dc_context_cancel_held``). They run on the loop's
    next turn, right after what was just delivered (an in-process handler's
    task runs before the library's threads are woken), or now without such a
    loop. Never raises."""
    if tokens is not None:
        loop, waker = _running_waker()
        if waker is None or waker._queue != queue:
            return False  # cannot happen with the package's _local_queue
        waker.deliver(loop, tokens)  # type: ignore[arg-type]
    else:
        loop, waker = _deliver_running()
    if not ticket:
        return None
    lib = native()
    try:
        if waker is not None:
            loop.call_soon(lib.run_held, ticket)  # type: ignore[union-attr]
            return None
        lib.run_held(ticket)  # no loop of this thread's waits on the library
    except Exception as e:  # noqa: BLE001 - the cancel that called this must not fail for it
        if loop is not None:
            loop.call_exception_handler({"message": "dynamo_ctx: running held wake-ups failed", "exception": e})
        # Otherwise the next call that waits runs them (dc_context_cancel_held).
    return None


def deliver_pending() -> None:
    """Deliver now what the library has queued for the running loop (kills,
    stops, arms), if anything: for code that runs many callbacks in one
    turn of the loop, so that a kill arriving in a long turn takes effect
    (an in-process handler's monitor aborts its engine, futures resolve)
    within it, not after every callback queued before its fd is polled.
    One ``read`` of the fd when nothing is queued; never raises (an error
    goes to the loop's exception handler, and the fd's callback delivers
    what is left)."""
    _deliver_running()


def _deliver_running() -> "Tuple[Optional[asyncio.AbstractEventLoop], Optional[_LoopWaker]]":
    """deliver_pending's work; returns the running loop and its waker (None
    where there is none), for _flush_local."""
    loop, waker = _running_waker()
    if waker is not None:
        waker.deliver(loop)  # type: ignore[arg-type]
    return loop, waker


def _running_waker() -> "Tuple[Optional[asyncio.AbstractEventLoop], Optional[_LoopWaker]]":
    """The running loop of this thread and its waker, each None where there
    is none; makes neither."""
    loop = asyncio._get_running_loop()
    return loop, (_wakers.get(loop) if loop is not None else None)


def _waker(loop: Optional[asyncio.AbstractEventLoop] = None) -> _LoopWaker:
    """The event queue of ``loop``, the running loop (the caller may name it:
    on Python < 3.12 finding it is a getpid() system call)."""
    if loop is None:
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


def on_stopped(ctx: Any, callback: Callable[[], object]) -> Callable[[], None]:
    """Run ``callback`` on the running loop, in the callback that learns of it
    (no task to wake first), once ``ctx`` is stopped or killed; return the
    function that cancels this. ``callback`` must not raise."""
    return _waker().on_state(ctx, native().STOPPED, callback)


_EAGER_START = sys.version_info >= (3, 12)


class _Rest(collections.abc.Coroutine):  # type: ignore[type-arg]
    """The rest of a coroutine whose first step eager_task ran already, for
    the task that runs it (before 3.12): the task's first send gets what that
    step yielded; every later send, and every throw (a cancellation
    included, even one before that first send), goes to the coroutine. With
    no coroutine (it ended in its first step) a throw raises what it throws."""

    def __init__(self, coro: "Coroutine[Any, Any, Any]") -> None:
        self._coro: "Optional[Coroutine[Any, Any, Any]]" = coro
        self._first: Any = None
        self._started = False

    def send(self, value: Any) -> Any:
        if self._coro is None:
            raise StopIteration
        if not self._started:
            self._started = True
            return self._first
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._started = True
        if self._coro is None:
            raise typ if val is None else val
        return self._coro.throw(typ) if val is None and tb is None else self._coro.throw(typ, val, tb)

    def close(self) -> None:
        if self._coro is not None:
            self._coro.close()

    def __next__(self) -> Any:
        return self.send(None)

    def __iter__(self) -> "_Rest":
        return self

    def __await__(self) -> "_Rest":
        return self


def eager_task(coro: "Coroutine[Any, Any, Any]") -> "asyncio.Future[Any]":
    """Run ``coro`` now, up to its first suspension, as a task: a future of
    its result, done already when it never suspended (Python 3.12's eager
    tasks, on every version).

    The task is current while ``coro`` runs, so what needs a task there
    (``asyncio.timeout``, ``wait_for``) works even when this is called from a
    plain loop callback; and it is the task's own, never the caller's, even
    when this is called from inside another task (a kill delivered within
    another request's step: ``deliver_pending``), so that what it starts (a
    timeout) cannot act on that other task. On 3.12+ it is one; before, the
    task is made first, made current for the first step and left, and then
    runs the rest (``_Rest``)."""
    loop = asyncio.get_running_loop()
    if _EAGER_START:
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg]
    rest = _Rest(coro)
    task: "asyncio.Task[Any]" = loop.create_task(rest)
    caller = asyncio.current_task(loop)
    if caller is not None:
        asyncio.tasks._leave_task(loop, caller)  # type: ignore[attr-defined]
    asyncio.tasks._enter_task(loop, task)  # type: ignore[attr-defined]
    try:
        rest._first = coro.send(None)
    except BaseException as e:  # noqa: BLE001 - the future carries it
        # Done in one step: the task, cancelled before its first step, ends
        # in _Rest without touching coro.
        rest._coro = None
        task.cancel()
        fut: "asyncio.Future[Any]" = loop.create_future()
        if isinstance(e, StopIteration):
            fut.set_result(e.value)
        else:
            fut.set_exception(e)
        return fut
    finally:
        asyncio.tasks._leave_task(loop, task)  # type: ignore[attr-defined]
        if caller is not None:
            asyncio.tasks._enter_task(loop, caller)  # type: ignore[attr-defined]
    return task


async def wait_for_state(ctx: Any, state: int) -> bool:
    """Return True once ``ctx`` reaches ``state`` (``_native.STOPPED`` or ``KILLED``).

    In a handler's task whose request is killed it never returns: it raises
    ``CancelledError`` (see ``cancel_on_kill``).
    """
    if (ctx._state_word() & native().STATE_MASK) < state:
        await _waker().wait(ctx, state)
    if _serving:
        await _raise_if_killed_handler()
    return True


# --- the handler's task and its request's kill --------------------------------
#
# The rule (docs/backend-guide.md): when a request's kill reaches the worker's
# event loop, the runtime cancels the task running its handler, once. The
# await in progress, or the next one, raises CancelledError; ``await
# context.killed()`` (and ``stopped()``) in that task never returns normally,
# whichever of the kill's wake-ups the loop happens to run first. Cleanup in
# ``finally`` may await: the cancellation is delivered once, not repeated.

_serving: "Dict[asyncio.Task[Any], Any]" = {}  # handler task -> its request's context
_cancelled_for_kill: "Set[asyncio.Task[Any]]" = set()  # tasks the rule has cancelled


def _cancel_for_kill(task: "asyncio.Task[Any]") -> bool:
    """Cancel ``task`` because its request was killed, unless it already was."""
    if task in _cancelled_for_kill or task.done():
        return False
    _cancelled_for_kill.add(task)
    task.cancel()
    return True


async def _raise_if_killed_handler() -> None:
    task = asyncio.current_task()
    ctx = _serving.get(task) if task is not None else None  # type: ignore[arg-type]
    if ctx is None or not ctx.is_killed():
        return
    # Either the kill got here before its wake-up did (cancel now), or the
    # wake-up cancelled this task from within its own step (deliver_pending,
    # called by _Sends.defer): either way a cancel may be pending on this
    # task. Let it land at this await, so that it is consumed here and awaits
    # in the handler's cleanup are not hit; when none is pending this await
    # returns and raises anyway.
    _cancel_for_kill(task)  # type: ignore[arg-type]
    await asyncio.sleep(0)
    raise asyncio.CancelledError()  # already cancelled once: this await raises too


def cancel_on_kill(ctx: Any, task: "asyncio.Task[Any]", loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """Apply the kill rule above to ``task``, the current task (running on
    ``loop``), the handler of the request whose context is ``ctx``; return
    the function that ends it (call it when the handler is done)."""
    _serving[task] = ctx
    stop = _waker(loop).on_state(ctx, native().KILLED, lambda: _cancel_for_kill(task))

    def release() -> None:
        stop()
        _serving.pop(task, None)
        _cancelled_for_kill.discard(task)

    return release


if hasattr(asyncio.Task, "cancelling"):

    def handler_task(coro: "Coroutine[Any, Any, None]", loop: asyncio.AbstractEventLoop) -> "asyncio.Task[None]":
        """Run a handler's coroutine as a task on ``loop``, the running loop (see ``cancel_requested``)."""
        return loop.create_task(coro)

    def cancel_requested(task: "asyncio.Task[Any]") -> bool:
        """Whether ``task`` was cancelled by someone (its CancelledError is
        not the handler's own): Task.cancelling() on Python 3.11+."""
        return task.cancelling() > 0

else:  # Python < 3.11: the handler's task records every cancel() itself

    class _HandlerTask(asyncio.Task):  # type: ignore[type-arg]
        _dc_cancel_requested = False

        def cancel(self, *args: Any, **kwargs: Any) -> bool:
            self._dc_cancel_requested = True
            return super().cancel(*args, **kwargs)

    def handler_task(coro: "Coroutine[Any, Any, None]", loop: asyncio.AbstractEventLoop) -> "asyncio.Task[None]":
        """Run a handler's coroutine as a task on ``loop``, the running loop (see ``cancel_requested``)."""
        return _HandlerTask(coro, loop=loop)

    def cancel_requested(task: "asyncio.Task[Any]") -> bool:
        """Whether ``task`` was cancelled by someone (its CancelledError is
        not the handler's own): the flag its cancel() set."""
        return getattr(task, "_dc_cancel_requested", False)
