"""The per-request cancellation context."""

from __future__ import annotations

import threading
from typing import Any, Dict, Mapping, Optional, Type

from ._aio import wait_for_state
from ._lib import native

_STATE_NAMES = ("LIVE", "STOPPED", "KILLED")


def __getattr__(name: str) -> int:
    """``context.LIVE``, ``STOPPED`` and ``KILLED``: the library's state values.

    They are read from the native module on first use (importing this module
    must not load the library), so no value is restated here.
    """
    if name in _STATE_NAMES:
        return int(getattr(native(), name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_real_classes: Dict[type, type] = {}
_real_lock = threading.Lock()


def _real_class(cls: type) -> type:
    """The class whose instances ``cls(...)`` really returns.

    It derives from the native type first, so ``is_stopped`` and friends are
    the C methods (reading the state word costs about an attribute read), and
    from ``cls``, so ``isinstance(ctx, Context)`` holds and the async methods
    below are found. It is built on first use because building it loads the
    native library, which ``import dynamo_ctx`` must not do.
    """
    real = _real_classes.get(cls)
    if real is None:
        with _real_lock:
            real = _real_classes.get(cls)
            if real is None:
                base = native().Context
                # _metadata: the request's metadata dict, unset (and costing
                # nothing) until given or first read.
                real = type(cls.__name__, (base, cls), {"__slots__": ("__weakref__", "_metadata"), "__module__": cls.__module__})
                real.__qualname__ = cls.__qualname__
                _real_classes[cls] = real
                _real_classes[real] = real
    return real


class Context:
    """One request's cancellation state.

    States only move forward: LIVE -> STOPPED -> KILLED (``kill()`` on a live
    context goes straight to KILLED). ``stop_generating()`` is graceful: the
    producer should stop producing, what it produced stays valid, and the
    stream ends cleanly. ``kill()`` is a hard abort. A killed context is also
    stopped.

    Children follow their parents: ``parent.link_child(child)`` (or
    ``parent.child()``) makes stopping or killing the parent do the same to the
    child, at once if the parent already is; cycles are harmless.

    A deadline (``timeout=``) kills the context with reason ``deadline`` when
    it passes, by a timer the native library holds: nothing to poll. Children
    keep the earlier of their own deadline and their parent's, and a request
    sent with ``context=`` carries the time left to every hop it reaches, each
    of which kills its own context then, also when the caller is unreachable.

    ``is_stopped()`` and ``is_killed()`` read a word the native library
    updates atomically, so they are cheap enough to call once per token and
    correct from any thread. The awaitables resolve on the running event loop,
    woken through a file descriptor, without polling.

    Creating the first Context loads the native library (never at import).
    """

    __slots__ = ()

    def __new__(
        cls, id: Optional[str] = None, metadata: Optional[Mapping[str, Any]] = None, timeout: Optional[float] = None  # noqa: A002
    ) -> "Context":
        """Create a live root context with the given id, or a new uuid4 id.

        An id is 1 to 256 bytes of printable UTF-8 (the request id's rule: the
        id travels with every request sent with this context); another is a
        ``ValueError`` saying so.

        ``metadata`` (a mapping with string keys and JSON values) becomes the
        context's ``metadata``, a copy of it. ``timeout`` (seconds, a finite
        number, 0 or more, under a year) gives it a deadline: it is killed
        with reason ``deadline`` that long from now (``ValueError`` for a bad
        value).

        Cheap: the native object is all there is until the context is linked,
        awaited or sent with a request (and a uuid is drawn only when asked for).
        """
        real = _real_classes.get(cls) or _real_class(cls)
        ctx: Context = real() if id is None else real(id)
        if metadata is not None:
            ctx._metadata = _metadata_dict(metadata)  # type: ignore[misc]  # a slot of the real class
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
            ctx._set_timeout(float(timeout))  # type: ignore[attr-defined]  # the native base's
        return ctx

    # No __init__: the native __new__ did everything, and a Python __init__
    # would run twice per Context() (once for the real class, once because
    # the object is also an instance of cls), each a Python call.

    # The synchronous methods below are implemented in C by the native base,
    # which comes first in the real class's MRO; these bodies only carry the
    # documentation and types.

    def id(self) -> str:
        """The request id, kept across every hop of the request."""
        raise NotImplementedError

    def is_stopped(self) -> bool:
        """True once the context is stopped or killed."""
        raise NotImplementedError

    def is_killed(self) -> bool:
        """True once the context is killed."""
        raise NotImplementedError

    def stop_generating(self) -> None:
        """Ask the producer to stop gracefully. Idempotent; never undoes a kill."""
        raise NotImplementedError

    def kill(self) -> None:
        """Abort the request now. Idempotent."""
        raise NotImplementedError

    def link_child(self, child: "Context") -> None:
        """Make ``child`` follow this context's stop and kill (applied at once if already cancelled)."""
        raise NotImplementedError

    def child(self) -> "Context":
        """Return a new context with this context's id, already linked as a child."""
        raise NotImplementedError

    def remaining(self) -> Optional[float]:
        """Seconds left until the deadline (0 once it has passed), or None without one."""
        raise NotImplementedError

    def reason(self) -> Optional[str]:
        """Why the context was cancelled, or None while it is live.

        One of ``stop_generating``, ``kill``, ``client_disconnected``,
        ``parent``, ``deadline``, ``connection_lost``, ``shutdown``.
        """
        # The names and the word's layout are the library's (_native.REASON_NAMES,
        # None for live; REASON_SHIFT, FIELD_MASK).
        lib = native()
        return lib.REASON_NAMES[(self._state_word() >> lib.REASON_SHIFT) & lib.FIELD_MASK]  # type: ignore[attr-defined,no-any-return]

    async def async_killed_or_stopped(self) -> bool:
        """Wait until the context is stopped or killed; return True (at once if it already is)."""
        return await wait_for_state(self, native().STOPPED)

    async def stopped(self) -> bool:
        """Wait until the context is stopped (a kill also counts); return True."""
        return await wait_for_state(self, native().STOPPED)

    async def killed(self) -> bool:
        """Wait until the context is killed (a stop alone does not count); return True."""
        return await wait_for_state(self, native().KILLED)

    @property
    def metadata(self) -> Dict[str, Any]:
        """The request's metadata: a live, mutable dict (string keys, JSON values).

        Changes made to it (item assignment, ``pop``, ...) are kept. It is
        carried with every request sent with ``context=`` this context (and
        with every migration attempt) to the handler's context, whose
        ``metadata`` starts as a copy of it. Encoded, it may take at most
        16 KiB.
        """
        try:
            return self._metadata  # type: ignore[has-type,no-any-return]
        except AttributeError:
            md: Dict[str, Any] = {}
            self._metadata = md  # type: ignore[misc]  # a slot of the real class (_real_class)
            return md

    @metadata.setter
    def metadata(self, value: Mapping[str, Any]) -> None:
        self._metadata = _metadata_dict(value)  # type: ignore[misc]  # a slot of the real class (_real_class)

    @property
    def trace_id(self) -> Optional[str]:
        """Distributed tracing is not part of dynamo_ctx: always None (kept for Dynamo's API)."""
        return None

    @property
    def span_id(self) -> Optional[str]:
        """Always None (see ``trace_id``)."""
        return None

    @property
    def parent_span_id(self) -> Optional[str]:
        """Always None (see ``trace_id``)."""
        return None

    def __repr__(self) -> str:
        state = "killed" if self.is_killed() else "stopped" if self.is_stopped() else "live"
        return f"<dynamo_ctx.Context id={self.id()!r} {state}>"


def _metadata_dict(value: Any) -> Dict[str, Any]:
    """A new dict with ``value``'s items, which must be a mapping with string keys."""
    if not isinstance(value, Mapping):
        raise TypeError(f"metadata must be a mapping, got {type(value).__name__}")
    md = dict(value)
    for k in md:
        if not isinstance(k, str):
            raise TypeError(f"metadata keys must be strings, got {k!r}")
    return md


def _has_metadata(ctx: Any) -> bool:
    """True when ``ctx`` has non-empty metadata (without creating an empty dict)."""
    return bool(getattr(ctx, "_metadata", None))


def _is_context(obj: Any) -> bool:
    return isinstance(obj, Context)


def real_class_of(cls: Type[Context]) -> type:
    """The native-backed class behind ``cls`` (for advanced use and tests)."""
    return _real_class(cls)
