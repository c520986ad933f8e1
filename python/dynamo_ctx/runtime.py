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
import logging
import os
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Optional, Set, TypeVar

from ._aio import arm, handler_task
from ._aio import cancel_on_kill as cancel_on_kill
from ._aio import cancel_requested as cancel_requested
from ._aio import deliver_pending as deliver_pending
from ._json import _dumps as _dumps
from ._json import _encode as _encode
from ._json import _encode_fast as _encode_fast
from ._json import _fast_encoder as _fast_encoder
from ._lib import _release as _release
from ._lib import native
from .client import Annotated, Client, ResponseStream
from .compat import DISCOVERY_BACKENDS as DISCOVERY_BACKENDS
from .compat import REQUEST_PLANES as REQUEST_PLANES
from .compat import _check_dynamo_args as _check_dynamo_args
from .compat import _log_ignored as _log_ignored
from .compat import _logged_values as _logged_values
from .compat import _worker_forms
from .context import Context, _has_metadata as _has_metadata, _real_class as _real_class
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
from .serving import _SEND_BATCH as _SEND_BATCH
from .serving import _local as _local
from .serving import _log_handler_error as _log_handler_error
from .serving import _relay as _relay
from .serving import _send_all as _send_all
from .serving import _send_some as _send_some
from .serving import _Sends as _Sends
from .serving import _sends_of_loop as _sends_of_loop
from .serving import _may_push
from .serving import _serve_one as _serve_one

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
    variable, else the library's default address (``_native.DEFAULT_NATS_URL``;
    go/natsbus owns the rule), starting an in-process NATS server
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
                lib.post_host_tick(self._handle)
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
        self._ep = 0  # the library's handle while serve_endpoint serves, else 0
        self._refused = 0  # the busy refusals, as last read (they outlive the handle)

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

    def set_engine_load(self, waiting: Optional[int], kv_usage: Optional[float]) -> None:
        """Report the engine's own load with this endpoint's load reports.

        ``waiting`` is the requests the engine's scheduler holds back,
        ``kv_usage`` the fraction of its KV cache in use (0 to 1); None leaves
        a figure out. Frontends send a new request to another instance
        before one whose engine has requests waiting or a fuller KV cache
        (docs/design.md, section 10). Cheap: a call with the figures it
        already has publishes nothing; call it when they change, e.g. after
        an engine step. Nothing is published for an endpoint served without
        a capacity (no ``max_num_seqs`` in its metadata), and the call does
        nothing while the endpoint is not being served.
        """
        ep = self._ep
        if ep:
            native().post_engine_load(
                ep, -1 if waiting is None else waiting, -1.0 if kv_usage is None else kv_usage
            )

    def busy_refusals(self) -> int:
        """The requests this endpoint refused as busy (at its capacity) so far.

        Such a request never reached a handler: its caller sent it to another
        instance or queued it. The count survives the end of serving (the
        last figure read stays).
        """
        ep = self._ep
        if ep:
            self._refused = native().endpoint_load(ep)[2]
        return self._refused

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
        push = _may_push(handler)
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
        self._ep = ep
        self._runtime._watch_host()
        tasks: Set["asyncio.Task[None]"] = set()
        loop = asyncio.get_running_loop()  # once: on Python < 3.12 each lookup is a getpid()
        try:
            while True:
                code, req = lib.endpoint_accept(ep)
                if code == lib.OK:
                    task = handler_task(_serve_one(lib, req, handler, pass_context, loop, push), loop)
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                elif code == lib.ECLOSED:
                    break
                else:
                    await arm(ep)
        finally:
            # Closing the endpoint kills the requests it is serving, whose
            # handlers then see their context killed and are closed.
            self.busy_refusals()  # the last figure, kept
            self._ep = 0
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


#: How often drain() looks whether the requests in flight have finished.
_DRAIN_POLL = 0.02


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
            discovery_backend, request_plane = _worker_forms()
            runtime = DistributedRuntime(loop, discovery_backend, request_plane, enable_nats)
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
