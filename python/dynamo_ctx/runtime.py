"""The distributed runtime: endpoints, handlers, clients (docs/design.md, section 3).

Requests and responses are JSON values. The request plane (NATS, response
streams, cancellation across processes) is in Go; this module is the asyncio
face of it: a dispatcher that runs each incoming request's handler as a task,
and response streams that are async iterators. Nothing here blocks the event
loop in a Go call: calls that wait (connecting, learning instances) run in the
default executor, everything else is non-blocking and is re-tried when the
library signals progress through the loop's file descriptor.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import os
import threading
import weakref
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Set

from ._aio import arm, cancel_on_kill, cancel_requested, deliver_pending, handler_task
from ._json import _dumps as _dumps
from ._json import _encode as _encode
from ._json import _encode_fast as _encode_fast
from ._json import _fast_encoder as _fast_encoder
from ._lib import _release as _release
from ._lib import native
from .client import Annotated, Client, ResponseStream
from .compat import _F as _F
from .compat import DISCOVERY_BACKENDS as DISCOVERY_BACKENDS
from .compat import REQUEST_PLANES as REQUEST_PLANES
from .compat import _check_dynamo_args as _check_dynamo_args
from .compat import _log_ignored as _log_ignored
from .compat import _logged_values as _logged_values
from .compat import dynamo_worker
from .context import Context, _has_metadata as _has_metadata, _real_class
from .errors import (
    BackendCancelled,
    HandlerError,
    NoResponders,
    RuntimeClosed,
    StreamIncomplete,
)
from .errors import _EXCEPTIONS as _EXCEPTIONS
from .errors import _exception_for as _exception_for
from .errors import _handler_prefix as _handler_prefix
from .errors import _IOFailure as _IOFailure
from .errors import _raise_for as _raise_for

logger = logging.getLogger("dynamo_ctx")

__all__ = [
    "DistributedRuntime",
    "Namespace",
    "Component",
    "Endpoint",
    "Client",
    "ResponseStream",
    "Annotated",
    "StreamIncomplete",
    "HandlerError",
    "BackendCancelled",
    "NoResponders",
    "RuntimeClosed",
    "Context",
    "dynamo_worker",
]


class DistributedRuntime:
    """One process's membership in the request plane.

    ``DistributedRuntime()`` uses NATS at the ``NATS_SERVER`` environment
    variable, else nats://127.0.0.1:4222, starting an in-process NATS server
    there when nothing answers (so other processes on the machine join it).
    ``nats_url=`` names a server or cluster explicitly.

    Dynamo's constructor forms are accepted: ``DistributedRuntime(loop,
    is_static)`` (0.5) and ``DistributedRuntime(loop, discovery_backend,
    request_plane[, enable_nats])`` (1.x; also as keywords). There is one
    discovery and one request plane here (NATS), so the loop and every known
    value select it (logged once at debug level); an unknown
    ``discovery_backend`` or ``request_plane`` is a ValueError.
    """

    def __init__(
        self,
        loop: Optional[asyncio.AbstractEventLoop] = None,
        *args: Any,
        nats_url: Optional[str] = None,
        is_static: Optional[bool] = None,
        discovery_backend: Optional[str] = None,
        request_plane: Optional[str] = None,
        enable_nats: Optional[bool] = None,
    ) -> None:
        if loop is not None and not isinstance(loop, asyncio.AbstractEventLoop):
            raise TypeError(f"loop must be an asyncio event loop or None, got {loop!r}")
        _check_dynamo_args(args, is_static, discovery_backend, request_plane, enable_nats)
        self._lib = native()
        if nats_url is None:
            # As Python sees it now: the library's copy of the environment
            # is the one it was loaded with.
            nats_url = os.environ.get(self._lib.NATS_ENV) or None
        self._handle: Optional[int] = self._lib.runtime_new(nats_url)
        self._closed = False
        self._host_watch: "Optional[asyncio.Task[None]]" = None

    def _h(self) -> int:
        if self._closed or self._handle is None:
            raise RuntimeClosed("the runtime is shut down")
        return self._handle

    @property
    def nats_url(self) -> str:
        """The NATS address this runtime is (or, after shutdown, was) connected to."""
        if self._handle is None:
            raise RuntimeClosed("the runtime was freed")
        url: str = self._lib.runtime_nats_url(self._handle)
        return url

    def namespace(self, name: str) -> "Namespace":
        """Return the namespace ``name``. Raises RuntimeClosed after shutdown."""
        self._h()
        _check_part("namespace", name)
        return Namespace(self, name)

    def endpoint(self, path: str) -> "Endpoint":
        """Return the endpoint at ``"namespace.component.endpoint"`` (a ``dyn://``
        prefix is allowed). Raises RuntimeClosed after shutdown."""
        self._h()
        if isinstance(path, str) and path.startswith("dyn://"):
            path = path[len("dyn://") :]
        if not isinstance(path, str):
            raise ValueError(f"endpoint path {path!r} must be a str")
        self._lib.endpoint_path_check(path)
        parts = path.split(".")
        return self.namespace(parts[0]).component(parts[1]).endpoint(parts[2])

    def _watch_host(self) -> None:
        """Tell the library, from this event loop, that the loop is awake (once per
        runtime, from the first ``serve_endpoint`` on). A loop blocked for longer than
        half the stream idle timeout (a handler that computes without awaiting) is
        taken for stalled: the library refuses new requests unstarted, so that their
        callers send them elsewhere, and lets the streams go silent, so that their
        callers migrate them, until the loop runs again."""
        if self._host_watch is None or self._host_watch.done():
            self._host_watch = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        lib = self._lib
        every = lib.HOST_TICK_MS / 1000
        while not self._closed and self._handle is not None:
            try:
                lib.runtime_host_tick(self._handle)
            except (RuntimeError, ValueError):
                return  # freed meanwhile
            await asyncio.sleep(every)

    def shutdown(self) -> None:
        """Shut down: handlers being served are killed (reason ``shutdown``),
        ``serve_endpoint`` calls return, instances leave discovery. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._lib.runtime_shutdown(self._handle)

    async def drain(self, timeout: float) -> bool:
        """Drain, then shut down: every endpoint this runtime serves leaves
        discovery at once (no new request reaches it; one already on its way
        is refused and goes to another instance), the requests in flight run
        on for up to ``timeout`` seconds, and then ``shutdown()`` ends whatever
        still runs without its final marker, so a caller with a migration
        limit continues it on another worker. Returns True when every request
        finished in time. A ``shutdown()`` meanwhile (a second signal) ends the
        wait at once."""
        if self._closed:
            return True
        lib = self._lib
        lib.runtime_drain(self._handle)
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, timeout)
        while not self._closed and lib.runtime_active(self._handle) > 0 and loop.time() < end:
            await asyncio.sleep(_DRAIN_POLL)
        finished = not self._closed and int(lib.runtime_active(self._handle)) == 0
        self.shutdown()
        return finished

    def is_shutdown(self) -> bool:
        """True once ``shutdown()`` was called."""
        return self._closed

    def etcd_client(self) -> None:
        """Dynamo 0.5's etcd client: always None here (no etcd; as Dynamo's static mode)."""
        return None

    def __del__(self) -> None:
        _release(self, "runtime_free")


def _check_part(kind: str, name: str) -> None:
    if not isinstance(name, str):
        raise ValueError(f"invalid {kind} name {name!r}: not a str")
    try:
        native().endpoint_name_check(name)  # the library's one rule
    except ValueError as e:
        raise ValueError(f"invalid {kind} name {name!r}: {e}") from None


class Namespace:
    """A namespace of components."""

    def __init__(self, runtime: DistributedRuntime, name: str) -> None:
        self.runtime, self.name = runtime, name

    def component(self, name: str) -> "Component":
        """Return the component ``name`` of this namespace. Raises RuntimeClosed after shutdown."""
        self.runtime._h()
        _check_part("component", name)
        return Component(self, name)


class Component:
    """A component: a group of endpoints served together."""

    def __init__(self, namespace: Namespace, name: str) -> None:
        self.namespace, self.name = namespace, name

    def __call__(self) -> "Component":
        """Return this component, so that Dynamo's ``endpoint.component()`` works
        as well as the attribute ``endpoint.component``."""
        return self

    async def create_service(self) -> None:
        """Prepare the component for serving (kept for API compatibility; nothing to do)."""
        self.namespace.runtime._h()

    def endpoint(self, name: str) -> "Endpoint":
        """Return the endpoint ``name`` of this component. Raises RuntimeClosed after shutdown."""
        self.namespace.runtime._h()
        _check_part("endpoint", name)
        return Endpoint(self, name)


def _is_async_gen_function(handler: Any) -> bool:
    for f in (handler, inspect.unwrap(handler) if callable(handler) else None, getattr(handler, "__call__", None)):  # noqa: B004 - the method itself, to inspect it
        if f is not None and inspect.isasyncgenfunction(f):
            return True
    return isinstance(handler, functools.partial) and _is_async_gen_function(handler.func)


def _accepts_context(handler: Callable[..., Any]) -> bool:
    try:
        return "context" in inspect.signature(handler).parameters
    except (TypeError, ValueError):
        return False


class Endpoint:
    """One endpoint: ``namespace.component.endpoint``."""

    def __init__(self, component: Component, name: str) -> None:
        self.component, self.name = component, name
        self.path = f"{component.namespace.name}.{component.name}.{name}"
        self._runtime = component.namespace.runtime
        self._serving: "Optional[asyncio.Future[int]]" = None

    def _serving_future(self) -> "asyncio.Future[int]":
        if self._serving is None or self._serving.get_loop() is not asyncio.get_running_loop():
            self._serving = asyncio.get_running_loop().create_future()
        return self._serving

    async def serving(self) -> int:
        """Wait until ``serve_endpoint`` has registered this endpoint; return its instance id."""
        return await asyncio.shield(self._serving_future())

    def connection_id(self) -> int:
        """The instance id under which ``serve_endpoint`` registered this endpoint (Dynamo's name).

        Raises RuntimeError while this endpoint is not being served.
        """
        f = self._serving
        if f is None or not f.done() or f.cancelled() or f.exception() is not None:
            raise RuntimeError(f"endpoint {self.path} is not being served")
        return f.result()

    async def lease_id(self) -> int:
        """Dynamo 0.5's name for ``connection_id()`` (the id ``direct`` routes to)."""
        return self.connection_id()

    async def serve_endpoint(
        self,
        handler: Callable[..., AsyncIterator[Any]],
        graceful_shutdown: bool = True,
        metrics_labels: Any = None,
        health_check_payload: Any = None,
        metadata: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Serve requests with ``handler`` until the runtime shuts down or this task is cancelled.

        ``handler(request)`` or ``handler(request, context=ctx)`` (the latter
        exactly when it has a parameter named ``context``) must be an async
        generator function; each yielded value (JSON) is one response item.
        The context has the caller's request id and follows the caller's stop
        and kill. After a kill the generator is closed and its output is no
        longer read, even if it ignores the context. ``metadata`` (JSON) is
        published with the instance, for example the model it serves.
        """
        if not _is_async_gen_function(handler):
            raise TypeError(f"handler {handler!r} is not an async generator function")
        pass_context = _accepts_context(handler)
        lib = native()
        serving = self._serving_future()
        try:
            meta = _dumps(metadata) if metadata is not None else None
            ep = await asyncio.get_running_loop().run_in_executor(None, lib.endpoint_serve, self._runtime._h(), self.path, meta)
        except BaseException as e:
            if not serving.done():
                serving.set_exception(e)
                serving.exception()  # raised here already: not "never retrieved" if nobody awaits serving()
            raise
        if not serving.done():
            serving.set_result(lib.endpoint_instance_id(ep))
        self._runtime._watch_host()
        tasks: Set["asyncio.Task[None]"] = set()
        try:
            while True:
                code, req = lib.endpoint_accept(ep)
                if code == lib.OK:
                    task = handler_task(_serve_one(lib, req, handler, pass_context))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                elif code == lib.ECLOSED:
                    break
                else:
                    await arm(ep)
        finally:
            # Closing the endpoint kills the requests it is serving, whose
            # handlers then see their context killed and are closed.
            lib.endpoint_free(ep)
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def client(self, migration_limit: int = 0, router_mode: Any = None) -> "Client":
        """Return a client of this endpoint (it learns the current instances first).

        ``migration_limit`` is how many times a request whose stream breaks
        (worker gone, connection lost, no responders) is retried on another
        worker, continuing where the last one stopped (docs/design.md, section 5).
        ``router_mode`` is Dynamo's: only None (round robin; ``random`` and
        ``direct`` are methods of the client) is supported here.
        """
        if router_mode is not None:
            raise ValueError(f"router_mode {router_mode!r} is not supported: use generate/round_robin, random or direct")
        lib = native()
        h = await asyncio.get_running_loop().run_in_executor(None, lib.client_new, self._runtime._h(), self.path)
        client = Client(self, h)
        client.migration_limit = migration_limit
        return client


def _log_handler_error(ctx: Context, e: BaseException) -> None:
    """Log a handler's exception on the worker, once per request: ERROR, with
    the request id (also as the record's ``request_id`` attribute) and the
    traceback. The caller gets "<Type>: <message>" as before."""
    rid = ctx.id()
    logger.error("request %s: handler raised %s: %s", rid, type(e).__name__, e, exc_info=e, extra={"request_id": rid})


#: Items a request may hold back before they are handed to the library at
#: once, without waiting for the end of the loop's turn.
_SEND_BATCH = 128

#: How often drain() looks whether the requests in flight have finished.
_DRAIN_POLL = 0.02


class _Sends:
    """The items every handler on one event loop yielded during a turn of it,
    handed to the library together at the end of the turn: one crossing for
    all requests (a decode step's tokens), however many items each has.

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
        """Send ``batch`` of request ``req`` at the end of this turn of the loop."""
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
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
            taken = self.lib.request_send_multi(reqs, batches)
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


def _sends_of_loop(lib: Any) -> _Sends:
    """The running loop's ``_Sends``."""
    loop = asyncio.get_running_loop()
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


async def _relay(lib: Any, req: int, ctx: Context, gen: Any, batch: List[bytes], sends: _Sends) -> None:
    """Pass the handler's items to the library: each goes out at the end of
    the loop's turn in which the handler yielded it, with every other
    request's (a lone item waits for nothing else), or at once when
    ``_SEND_BATCH`` piled up. The task awaits the handler directly, so a
    cancellation always lands in it. The caller counts as killed before
    every item."""
    killed, encode, defer = ctx.is_killed, lib.encode_json, sends.defer  # per item: no lookups
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


async def _serve_one(lib: Any, req: int, handler: Callable[..., Any], pass_context: bool) -> None:
    """Run one request's handler in this task, streaming its items to the caller.

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
    task = asyncio.current_task()
    sends = _sends_of_loop(lib)
    release = cancel_on_kill(ctx)
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
        await _relay(lib, req, ctx, gen, batch, sends)
        lib.request_complete(req)
    except asyncio.CancelledError as e:
        if ctx.is_killed():
            pass  # the kill's cancellation: the stream already ended for the caller
        elif task is not None and cancel_requested(task):
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

