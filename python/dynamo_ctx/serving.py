"""Serving an endpoint's requests: each request's handler runs as a task
(``_serve_one``), and the items it yields are handed to the library at the end
of the loop's turn, every request's together (``_Sends``). ``Endpoint.serve_endpoint``
in runtime.py accepts the requests; runtime.py re-exports these names.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional

from ._aio import arm, cancel_on_kill, cancel_requested, deliver_pending
from ._json import _dumps
from .context import Context, _real_class

logger = logging.getLogger("dynamo_ctx")


def _log_handler_error(ctx: Context, e: BaseException) -> None:
    """Log a handler's exception on the worker, once per request: ERROR, with
    the request id (also as the record's ``request_id`` attribute) and the
    traceback. The caller gets "<Type>: <message>" as before."""
    rid = ctx.id()
    logger.error("request %s: handler raised %s: %s", rid, type(e).__name__, e, exc_info=e, extra={"request_id": rid})


#: Items a request may hold back before they are handed to the library at
#: once, without waiting for the end of the loop's turn.
_SEND_BATCH = 128


class _Sends:
    """The items every handler on one event loop yielded during a turn of it,
    handed to the library together at the end of the turn: one message for
    all requests (a decode step's tokens), however many items each has,
    posted to the library without a call into it (``request_post_multi``:
    the call itself while a request's buffer is full, so that its answers
    say which).

    A request's ``batch`` is its own list of encoded items, shared with its
    task: whoever sends from it (this, ``_send_all``) takes from the front
    and deletes what the library took before anything else runs, so items
    keep their order whoever sends them. What a full buffer refuses is sent
    when the request can take more, even while its handler waits on
    something else.
    """

    __slots__ = ("lib", "loop_ref", "pending", "draining")

    #: Every this many requests deferred in one turn, what the library queued
    #: for the loop is delivered (``deliver_pending``): with a thousand
    #: streams a decode step's turn takes tens of milliseconds, and a kill
    #: arriving during it would otherwise wait for all of it.
    DELIVER_EVERY = 64

    def __init__(self, lib: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.lib = lib
        # Weak: the thread-local that holds this must not keep a finished
        # loop (and its event queue's fd) alive until the thread's next loop.
        self.loop_ref = weakref.ref(loop)
        self.pending: Dict[int, List[bytes]] = {}
        self.draining: Dict[int, "asyncio.Task[None]"] = {}  # requests whose buffer was full

    def defer(self, req: int, batch: List[bytes]) -> None:
        """Send ``batch`` of request ``req`` at the end of this turn of the loop
        (this object's loop, the running one)."""
        if not self.pending:
            loop = self.loop_ref()
            assert loop is not None  # it runs this
            loop.call_soon(self.flush)
        self.pending[req] = batch
        if len(self.pending) % self.DELIVER_EVERY == 0:  # the requests deferred this turn
            deliver_pending()

    def drop(self, req: int) -> None:
        """Forget ``req`` (before its handle is freed)."""
        self.pending.pop(req, None)
        task = self.draining.pop(req, None)
        if task is not None:
            task.cancel()

    def flush(self) -> None:
        pending, self.pending = self.pending, {}
        reqs = [r for r, b in pending.items() if b]
        if not reqs:
            return
        batches = [pending[r] for r in reqs]
        try:
            taken = self.lib.request_post_multi(reqs, batches)
        except Exception as e:  # noqa: BLE001 - left in the batches: the next direct send raises it
            logger.debug("handing items to the library failed: %r", e)
            return
        for req, batch, n in zip(reqs, batches, taken):
            if n > 0:
                del batch[:n]
            if n >= 0 and batch and req not in self.draining:
                self.draining[req] = asyncio.get_running_loop().create_task(self._drain(req, batch))

    async def _drain(self, req: int, batch: List[bytes]) -> None:
        """Send what a full buffer refused as room frees up (after a kill the
        library takes everything, so this ends then too)."""
        try:
            while batch:
                await arm(req)
                _send_some(self.lib, req, batch)
        except asyncio.CancelledError:
            pass  # dropped: the request ended
        except Exception as e:  # noqa: BLE001 - the request's own next send raises it
            logger.debug("sending the rest of request %d's items failed: %r", req, e)
        finally:
            if self.draining.get(req) is asyncio.current_task():
                del self.draining[req]


_local = threading.local()

#: The item sink of the request whose handler this task runs (``item_sink``).
_sink: "contextvars.ContextVar[Optional[Callable[[Any], None]]]" = contextvars.ContextVar("dynamo_ctx_item_sink", default=None)

#: The attribute that marks a handler's function as one that may hand its
#: items over through ``item_sink`` (``pushes_items``).
_PUSHES = "__dynamo_ctx_pushes_items__"


def pushes_items(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn``, a handler method of this package's backends, as one that
    may hand its items over through ``item_sink``. Only a bound method so
    marked, served as it is, gets a sink: a function that wraps it (a user's
    handler that filters or rewrites the items) is served without one, and
    the method it calls then yields its items, through the wrapper."""
    setattr(fn, _PUSHES, True)
    return fn


def _may_push(handler: Callable[..., Any]) -> bool:
    """Whether ``handler``, as served, gets an item sink (``pushes_items``)."""
    return inspect.ismethod(handler) and getattr(handler.__func__, _PUSHES, False)


def item_sink() -> Optional[Callable[[Any], None]]:
    """For a served handler marked ``pushes_items``: a function that hands the
    caller one item as if the handler had yielded it at that moment, from any
    callback of the handler's event loop (an engine's output callback), so
    that the handler's task need not wake for each item. The first call in
    the request's task takes it (later ones, and tasks started after that,
    get None); None in any other task.

    The item goes with the turn's other items (``_Sends``); after the
    caller's kill it is dropped, as a yield's would no longer be read. It
    raises what encoding the item raises (an item that is not JSON). The
    handler must not return before its last item is handed over: what it
    handed over is sent before the stream ends. Items wait in memory while
    the caller's stream is full (at most what the request makes).

    The sink's ``request`` is the library's handle of the request it serves:
    where the library itself may send items too (backends/vllm_outputs.py),
    which go ahead of those the sink holds for the turn's end."""
    sink = _sink.get()
    if sink is not None:
        _sink.set(None)
    return sink


def _sends_of_loop(lib: Any, loop: asyncio.AbstractEventLoop) -> _Sends:
    """The ``_Sends`` of ``loop``, the running loop."""
    s: Optional[_Sends] = getattr(_local, "sends", None)
    if s is None or s.loop_ref() is not loop:
        s = _local.sends = _Sends(lib, loop)
    return s


def _send_some(lib: Any, req: int, batch: List[bytes]) -> None:
    """Hand the library as much of ``batch`` as its buffer takes, now."""
    if batch:
        n = lib.request_send_many(req, batch)
        del batch[:n]


async def _send_all(lib: Any, req: int, ctx: Context, batch: List[bytes]) -> None:
    """Hand the library all of ``batch``, waiting while its buffer is full
    (after a kill the library drops items, so this never waits for long)."""
    _send_some(lib, req, batch)
    while batch and not ctx.is_killed():
        await arm(req)
        _send_some(lib, req, batch)
    batch.clear()


async def _relay(lib: Any, req: int, ctx: Context, gen: Any, batch: List[bytes], sends: _Sends, push: bool = False) -> None:
    """Pass the handler's items to the library: each goes out at the end of
    the loop's turn in which the handler yielded it, with every other
    request's (a lone item waits for nothing else), or at once when
    ``_SEND_BATCH`` piled up. The task awaits the handler directly, so a
    cancellation always lands in it. The caller counts as killed before
    every item."""
    killed, encode, defer = ctx.is_killed, lib.encode_json, sends.defer  # per item: no lookups
    if push:

        def sink(item: Any) -> None:
            if killed():
                return
            data = encode(item)
            if data is None:
                data = _dumps(item)
            batch.append(data)
            if len(batch) == 1:
                defer(req, batch)
            elif len(batch) % _SEND_BATCH == 0 and req not in sends.draining:
                _send_some(lib, req, batch)  # what the library takes now; the rest goes at the turn's end

        sink.request = req  # type: ignore[attr-defined]  # the library's request: where the library may send items itself
        _sink.set(sink)  # this task's context: the handler's code takes it (item_sink)
    async for item in gen:
        if killed():
            return
        data = encode(item)  # the common items, in C
        if data is None:
            data = _dumps(item)  # the rest, by Python's encoder (and its errors)
        batch.append(data)
        if len(batch) >= _SEND_BATCH:
            await _send_all(lib, req, ctx, batch)
        elif len(batch) == 1:  # else it is already handed over this turn, or being drained
            defer(req, batch)
    await _send_all(lib, req, ctx, batch)


async def _serve_one(
    lib: Any, req: int, handler: Callable[..., Any], pass_context: bool, loop: asyncio.AbstractEventLoop, push: bool = False
) -> None:
    """Run one request's handler in this task (on ``loop``), streaming its items to the caller
    (``push``: the handler may also hand them over through ``item_sink``; ``_may_push``).

    How it ends (docs/design.md, section 3):
    - The handler returns: the stream completes.
    - The request is killed: this task is cancelled when the kill reaches the
      loop (``cancel_on_kill``: any await in the handler raises
      ``CancelledError``), the generator is closed and its output no longer
      read; the caller's stream ends as the kill ends it.
    - The handler raises anything while its context is live, ``CancelledError``
      included: a handler error, "<Type>: <message>".
    - This task is cancelled by someone else (the loop or the endpoint
      shutting down: ``cancel_requested``): the cancellation propagates.
    """
    ctx = lib.request_context(req, _real_class(Context))
    task = asyncio.current_task(loop)
    assert task is not None
    sends = _sends_of_loop(lib, loop)
    release = cancel_on_kill(ctx, task, loop)
    gen: Any = None
    batch: List[bytes] = []  # encoded items not yet handed to the library
    try:
        request = json.loads(lib.request_payload(req).decode())
        meta = lib.request_metadata(req)
        if meta:
            ctx._metadata = json.loads(meta.decode())
        gen = handler(request, context=ctx) if pass_context else handler(request)
        if not hasattr(gen, "__anext__"):
            raise TypeError(f"handler returned {type(gen).__name__}, not an async generator")
        await _relay(lib, req, ctx, gen, batch, sends, push)
        lib.request_complete(req)
    except asyncio.CancelledError as e:
        if ctx.is_killed():
            pass  # the kill's cancellation: the stream already ended for the caller
        elif cancel_requested(task):
            raise  # cancelled from outside: the endpoint's or the loop's own teardown
        else:  # the handler raised it itself
            _log_handler_error(ctx, e)
            await _send_all(lib, req, ctx, batch)  # what it yielded before, as for any other error
            lib.request_fail(req, f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - every handler error goes to the caller
        _log_handler_error(ctx, e)
        await _send_all(lib, req, ctx, batch)  # what it yielded before it raised
        lib.request_fail(req, f"{type(e).__name__}: {e}")
    finally:
        if gen is not None and hasattr(gen, "aclose"):
            try:
                await gen.aclose()
            except BaseException as e:  # noqa: BLE001 - a misbehaving generator must not break the loop
                if not isinstance(e, (RuntimeError, asyncio.CancelledError, GeneratorExit, StopAsyncIteration)):
                    logger.debug("closing the handler of request %s raised %r", ctx.id(), e)
        release()
        sends.drop(req)
        lib.request_free(req)
