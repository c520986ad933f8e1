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
import collections
import functools
import inspect
import json
import logging
import os
import threading
import weakref
from typing import Any, AsyncIterator, Awaitable, Callable, Deque, Dict, List, Optional, Set, Tuple, TypeVar

from ._aio import arm, cancel_on_kill, cancel_requested, deliver_pending, handler_task
from ._lib import native
from .context import Context, _has_metadata, _real_class

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


class StreamIncomplete(ValueError):
    """The response stream ended before generation completed.

    Raised when the worker went away mid-stream, or when the handler stopped
    its own request and returned. The message starts with
    "Stream ended before generation completed" (Dynamo 1.x words it
    "Disconnected: Stream ended ..."; match ``code`` instead of the text).
    """

    #: Stable code to match on instead of the message.
    code = "disconnected"


class HandlerError(ValueError):
    """The handler raised while its request was live.

    The message is "a python exception was caught while processing the async
    generator: <Type>: <message>" (the wording Dynamo's clients match on);
    ``error_type`` is ``<Type>``, the name of the handler's exception class.
    """

    #: Stable code to match on instead of the message.
    code = "handler_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        prefix = _handler_prefix()
        rest = message[len(prefix) :] if message.startswith(prefix) else message
        #: The name of the exception class the handler raised ("" if unknown).
        self.error_type: str = rest.split(":", 1)[0] if ":" in rest else ""


class BackendCancelled(HandlerError):
    """The handler raised ``asyncio.CancelledError`` while its request was live
    (Dynamo 1.x names this case "BackendCancelled" in its message)."""

    code = "backend_cancelled"


class NoResponders(ConnectionError):
    """No worker instance received the request (none known, or the chosen one is gone)."""


class RuntimeClosed(RuntimeError):
    """The runtime was shut down."""


def _handler_prefix() -> str:
    """What starts a remote handler's failure message (Go owns the wording)."""
    return native().HANDLER_ERROR_PREFIX  # type: ignore[no-any-return]


# One encoder for every item: json.dumps with options builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _fast_encoder() -> Optional[Callable[[Any], str]]:
    """The C encoder that ``_encode`` makes anew for every call, made once
    (3x faster for a small item), or None where this Python's private
    ``c_make_encoder`` is missing or differs: then ``_encode`` is used."""
    try:
        from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]

        def default(o: Any) -> Any:
            raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

        # markers None: no circular check (a cycle is a RecursionError, mapped below).
        c = c_make_encoder(None, default, encode_basestring_ascii, None, ":", ",", False, False, False)

        def encode(value: Any) -> str:
            return "".join(c(value, 0))

        sample = {"a": [1, 2.5, "é\n", None, True], "b": {"c": -3}}
        if encode(sample) != _encode(sample):
            return None
        return encode
    except Exception:  # noqa: BLE001 - any difference: the public encoder
        return None


_encode_fast = _fast_encoder() or _encode


def _dumps(value: Any) -> bytes:
    try:
        return _encode_fast(value).encode()
    except (TypeError, ValueError) as e:
        raise TypeError(f"value is not JSON-serialisable: {e}") from None
    except RecursionError:
        raise TypeError("value is not JSON-serialisable: circular reference or nested too deeply") from None


class _IOFailure(OSError, RuntimeError):
    """DC_EIO: the operating system or the network refused. An OSError, as the
    native module's calls always raised, and a RuntimeError, as a stream's
    errors always were."""


# The one table from the library's error codes (by name, see
# ``_native.ERROR_NAMES``) to exception classes; codes not here raise
# RuntimeError. The native module builds its exceptions here too.
_EXCEPTIONS = {
    "EINVAL": ValueError,
    "EBADF": ValueError,
    "ERANGE": ValueError,
    "EEXIST": ValueError,
    "ENOENT": ValueError,
    "EIO": _IOFailure,
    "EINCOMPLETE": StreamIncomplete,
    "ENORESPONDERS": NoResponders,
    "ECLOSED": RuntimeClosed,
}


def _exception_for(code: int, message: str) -> Exception:
    """The exception for the library's error ``code`` with its ``message``."""
    name = native().ERROR_NAMES.get(code, "")
    if name == "EHANDLER":
        if message.startswith(_handler_prefix() + "CancelledError:"):
            return BackendCancelled(message)
        return HandlerError(message)
    cls = _EXCEPTIONS.get(name, RuntimeError)
    e: Exception = cls(message)
    if getattr(cls, "code", None) is None:
        # The library's code and its name, for programs (the message is for
        # people); classes with a stable code of their own (StreamIncomplete,
        # NoResponders, ...) keep it.
        setattr(e, "code", code)  # noqa: B010 - attributes the class does not declare
        setattr(e, "code_name", name or "EUNKNOWN")  # noqa: B010
    return e


def _raise_for(code: int, message: str) -> None:
    raise _exception_for(code, message)


def _release(obj: Any, free: str) -> None:
    """Free ``obj``'s native handle once, from ``__del__``: quietly, since at
    interpreter shutdown or in a forked child the library may refuse."""
    h, obj._handle = getattr(obj, "_handle", None), None
    if h is not None:
        try:
            getattr(obj._lib, free)(h)
        except Exception:  # noqa: BLE001
            pass


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


class Annotated:
    """One response item; ``data()`` is the JSON value the handler yielded."""

    __slots__ = ("_data",)

    def __init__(self, data: Any) -> None:
        self._data = data

    def data(self) -> Any:
        """The item's value."""
        return self._data

    def __repr__(self) -> str:
        return f"Annotated(data={self._data!r})"


class Client:
    """Sends requests to the instances of one endpoint."""

    def __init__(self, endpoint: Endpoint, handle: int) -> None:
        self.endpoint = endpoint
        self._lib = native()
        self._handle: Optional[int] = handle

    @property
    def migration_limit(self) -> int:
        """Retries after the first attempt when a stream breaks (0: none)."""
        return self._migration_limit

    @migration_limit.setter
    def migration_limit(self, n: int) -> None:
        if not isinstance(n, int):
            raise ValueError(f"migration_limit must be an int >= 0, got {n!r}")
        self._lib.client_set_migration_limit(self._handle, n)  # checks the range (ValueError)
        self._migration_limit = n
        logger.debug("migration_limit for %s set to %d", self.endpoint.path, n)

    def instance_ids(self) -> List[int]:
        """The ids of the instances currently known. Raises RuntimeClosed
        after shutdown."""
        self.endpoint._runtime._h()
        ids: List[int] = self._lib.client_instances(self._handle)
        return ids

    async def wait_for_instances(self) -> List[int]:
        """Wait until at least one instance is known; return the instance ids.

        Raises RuntimeClosed at once if the runtime is shut down, before or
        during the wait (the shutdown closes the client, which wakes it).
        """
        runtime = self.endpoint._runtime
        while True:
            runtime._h()
            ids = self.instance_ids()
            if ids:
                return ids
            await arm(self._handle)  # type: ignore[arg-type]  # None once freed: the library refuses it

    async def _generate(self, request: Any, annotated: bool, context: Optional[Context], route: int, instance_id: int) -> "ResponseStream":
        if context is not None and not isinstance(context, Context):
            raise TypeError("context must be a dynamo_ctx.Context")
        self.endpoint._runtime._h()
        meta = _dumps(context._metadata) if context is not None and _has_metadata(context) else None
        h = self._lib.client_generate(self._handle, _dumps(request), context, route, instance_id, meta)
        stream = ResponseStream(self._lib, h, annotated, context)
        await stream._wait_started()
        return stream

    async def generate(self, request: Any, annotated: bool = True, context: Optional[Context] = None) -> "ResponseStream":
        """Send ``request`` to an instance (round robin) and return its response stream.

        With ``context=``, the request's context is a new child of it with the
        same id, linked before the request is sent: stopping or killing
        ``context`` stops or kills the remote handler.
        """
        return await self._generate(request, annotated, context, self._lib.ROUTE_ROUND_ROBIN, 0)

    async def round_robin(self, request: Any, annotated: bool = True, context: Optional[Context] = None) -> "ResponseStream":
        """Like ``generate``: the next instance in turn."""
        return await self._generate(request, annotated, context, self._lib.ROUTE_ROUND_ROBIN, 0)

    async def random(self, request: Any, annotated: bool = True, context: Optional[Context] = None) -> "ResponseStream":
        """Like ``generate``, to a random instance."""
        return await self._generate(request, annotated, context, self._lib.ROUTE_RANDOM, 0)

    async def direct(self, request: Any, instance_id: int, annotated: bool = True, context: Optional[Context] = None) -> "ResponseStream":
        """Like ``generate``, to the instance ``instance_id``."""
        return await self._generate(request, annotated, context, self._lib.ROUTE_DIRECT, instance_id)

    def __del__(self) -> None:
        _release(self, "client_free")


class ResponseStream:
    """The response of one request, as an async iterator.

    Breaking out of ``async for`` cancels nothing (iterate again to continue).
    ``await stream.aclose()`` kills the remote request, and so does the stream
    being garbage-collected before it ended.

    A kill ends the stream: once the caller's context (``context=``), the
    request's own context (``context()``) is killed or ``aclose()`` was
    awaited, no further item is returned, whatever was already buffered.
    """

    def __init__(self, lib: Any, handle: int, annotated: bool, context: Optional[Context] = None) -> None:
        self._lib = lib
        self._handle: Optional[int] = handle
        self._annotated = annotated
        self._context = context
        self._own: Optional[Context] = None  # the request's context, once asked for
        self._buf: Deque[Any] = collections.deque()  # items taken, decoded
        self._ended = False
        self._closed = False
        self._epoch = -1  # lib.kill_epoch() when the library last found the request not killed

    async def _wait_started(self) -> None:
        while True:
            code, message = self._lib.stream_started(self._handle)
            if code == self._lib.OK:
                return
            if code != self._lib.EAGAIN:
                self._ended = True
                _raise_for(code, message)
            await arm(self._handle)  # type: ignore[arg-type]  # None once freed: the library refuses it

    def context(self) -> Context:
        """The request's context (a child of the caller's, with the same id)."""
        if self._own is None:
            self._own = self._lib.stream_context(self._handle, _real_class(Context))
        return self._own

    def __aiter__(self) -> "ResponseStream":
        return self

    async def __anext__(self) -> Any:
        lib = self._lib
        while True:
            if self._buf:
                # Checked before every item, not once per batch: a kill (or
                # aclose) between two items drops the rest of the batch.
                # Whether the request counts as killed is the library's rule
                # (plane.Stream.Killed, which its takes apply too); it is asked
                # again only when some context was killed since it last said no.
                if not (self._closed or self._handle is None):
                    epoch = lib.kill_epoch()
                    if epoch == self._epoch or not lib.stream_killed(self._handle):
                        self._epoch = epoch
                        data = self._buf.popleft()
                        return Annotated(data) if self._annotated else data
                self._buf.clear()  # a kill is a hard abort: buffered items are dropped
            if self._closed or self._handle is None:
                raise StopAsyncIteration
            code, value = lib.stream_take_json(self._handle)
            if code == lib.OK:
                self._buf.extend(json.loads(value))  # one parse for the whole batch
            elif code == lib.EAGAIN:
                await arm(self._handle)
            elif code == lib.EOF:
                self._ended = True
                raise StopAsyncIteration
            else:
                self._ended = True
                _raise_for(code, value)

    async def aclose(self) -> None:
        """Kill the remote request (if still running) and end the stream: no
        item is returned after this, buffered ones included."""
        if self._handle is not None and not self._ended:
            self._lib.stream_kill(self._handle)
        self._ended = True
        self._closed = True
        self._buf.clear()

    def __del__(self) -> None:
        _release(self, "stream_free")  # kills the request if it has not ended



# --- Dynamo compatibility (docs/dynamo-compat.md) ----------------------------

#: Dynamo 1.x values of DistributedRuntime's discovery_backend and
#: request_plane. dynamo_ctx has one of each (NATS), which every value selects.
DISCOVERY_BACKENDS = ("etcd", "file", "mem", "kubernetes")
REQUEST_PLANES = ("nats", "tcp", "http")

_logged_values: Set[Tuple[str, Any]] = set()


def _log_ignored(name: str, value: Any) -> None:
    if (name, value) not in _logged_values:
        _logged_values.add((name, value))
        logger.debug("DistributedRuntime: %s=%r has no meaning here: the NATS request plane serves", name, value)


def _check_dynamo_args(
    args: Tuple[Any, ...],
    is_static: Optional[bool],
    discovery_backend: Optional[str],
    request_plane: Optional[str],
    enable_nats: Optional[bool],
) -> None:
    """Validate Dynamo's positional constructor forms (after the loop):
    ``(is_static)`` or ``(discovery_backend, request_plane[, enable_nats])``."""
    if len(args) == 1 and not isinstance(args[0], str):
        (pos_static,) = args
        if is_static is not None:
            raise TypeError("DistributedRuntime() got is_static both by position and by keyword")
        is_static = pos_static
    elif args:
        if len(args) > 3:
            raise TypeError(f"DistributedRuntime() takes at most 4 positional arguments ({len(args) + 1} given)")
        names = ("discovery_backend", "request_plane", "enable_nats")
        given: Dict[str, Any] = {"discovery_backend": discovery_backend, "request_plane": request_plane, "enable_nats": enable_nats}
        for name, value in zip(names, args):
            if given[name] is not None:
                raise TypeError(f"DistributedRuntime() got {name} both by position and by keyword")
            given[name] = value
        discovery_backend, request_plane, enable_nats = given["discovery_backend"], given["request_plane"], given["enable_nats"]
    if is_static is not None:
        if not isinstance(is_static, bool):
            raise TypeError(f"is_static must be a bool, got {is_static!r}")
        _log_ignored("is_static", is_static)
    if discovery_backend is not None:
        if discovery_backend not in DISCOVERY_BACKENDS:
            raise ValueError(f"unknown discovery_backend {discovery_backend!r}: one of {', '.join(DISCOVERY_BACKENDS)}")
        _log_ignored("discovery_backend", discovery_backend)
    if request_plane is not None:
        if request_plane not in REQUEST_PLANES:
            raise ValueError(f"unknown request_plane {request_plane!r}: one of {', '.join(REQUEST_PLANES)}")
        _log_ignored("request_plane", request_plane)
    if enable_nats is not None:
        if not isinstance(enable_nats, bool):
            raise TypeError(f"enable_nats must be a bool, got {enable_nats!r}")
        _log_ignored("enable_nats", enable_nats)


_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])


def dynamo_worker(enable_nats: Optional[bool] = None, register_shutdown: bool = False, *, static: bool = False) -> Callable[[_F], _F]:
    """Decorator: run an async worker function with a new DistributedRuntime as its first argument.

    ``@dynamo_worker()`` (also ``static=`` of Dynamo 0.5 and ``enable_nats=``
    of 1.x, both without effect here). The runtime is made on the running
    loop from ``DYN_DISCOVERY_BACKEND`` and ``DYN_REQUEST_PLANE`` (checked as
    by the constructor) and is shut down when the function returns or
    raises. With ``register_shutdown=True``, SIGINT and SIGTERM shut the
    runtime down (so ``serve_endpoint`` returns).
    """

    def decorator(func: _F) -> _F:
        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            runtime = DistributedRuntime(
                loop,
                os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
                os.environ.get("DYN_REQUEST_PLANE", "tcp"),
                enable_nats,
            )
            if static:
                _log_ignored("static", static)
            if register_shutdown:
                import signal

                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, runtime.shutdown)
            try:
                return await func(runtime, *args, **kwargs)
            finally:
                runtime.shutdown()

        return wrapper  # type: ignore[return-value]

    return decorator
