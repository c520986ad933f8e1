"""The caller's side: clients of an endpoint and their response streams
(docs/design.md, section 3)."""

from __future__ import annotations

import collections
import json
import logging
from typing import Any, Deque, List, Optional, Protocol

from ._aio import arm
from ._json import _dumps
from ._lib import _release, native
from .context import Context, _has_metadata, _real_class
from .errors import _raise_for

logger = logging.getLogger("dynamo_ctx")

__all__ = ["Annotated", "Client", "ResponseStream"]


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


class _Runtime(Protocol):
    def _h(self) -> int: ...  # the handle; RuntimeClosed after shutdown


class _Endpoint(Protocol):
    """What a Client uses of its ``runtime.Endpoint``: described here, since
    runtime.py imports this module and so this one does not import it."""

    @property
    def path(self) -> str: ...

    @property
    def _runtime(self) -> _Runtime: ...


class Client:
    """Sends requests to the instances of one endpoint."""

    def __init__(self, endpoint: _Endpoint, handle: int) -> None:
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

