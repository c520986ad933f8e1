"""Loading the native library, once, lazily, and for good.

The library is a Go c-shared library: loading it starts the Go runtime's
threads, and a process that forks after that cannot use it in the child. So
nothing is loaded at ``import dynamo_ctx``; the first Context (or runtime)
created calls :func:`native`. The library is never unloaded: a Go runtime
cannot be unloaded, and CPython never unloads extension modules anyway.

Go never calls Python. Its log records wait in a queue inside the library
whose file descriptor a daemon thread here watches; the thread drains them
into the ``dynamo_ctx`` logger.

Nor does the module's C code import Python modules: it calls three Python
functions registered with it (``_register_callbacks``): the one table from
error codes to exceptions (``errors._exception_for``), the flush of what
a cancel woke on the running loop (``_aio._flush_local``), and the lookup of
that loop's event queue (``_aio._local_queue``). This module imports none
(they import it): the package's ``__init__`` tells it of them
(:func:`set_callbacks`), and loading the library registers them before any
call can raise. Importing any ``dynamo_ctx.*`` module runs that ``__init__``
first, so every road to the library passes there.
"""

from __future__ import annotations

import logging
import select
import threading
from types import ModuleType
from typing import Any, Callable, Dict, Optional

logger = logging.getLogger("dynamo_ctx")

_lock = threading.Lock()
# Held while records move from the library to the logger, so that drain_logs()
# returning means every record taken so far has been logged.
_log_lock = threading.Lock()
_native: Optional[ModuleType] = None
# The Python functions the module's C code calls, by _register_callbacks'
# argument names: set by set_callbacks, registered when the library loads.
_callbacks: Dict[str, Any] = {}


def set_callbacks(
    *,
    exception_for: Callable[[int, str], BaseException],
    flush_local: Callable[..., Optional[bool]],
    local_queue: Optional[Callable[[], int]] = None,
) -> None:
    """Tell the library the package's functions its C code calls: registered
    when it loads, or now if it is loaded (a later call replaces them)."""
    with _lock:
        _callbacks.update(exception_for=exception_for, flush_local=flush_local, local_queue=local_queue)
        if _native is not None:
            _native._register_callbacks(**_callbacks)


def native() -> ModuleType:
    """Return the ``dynamo_ctx._native`` module, loading it on first use."""
    mod = _native
    if mod is not None:
        return mod
    return _load()


def loaded() -> bool:
    """Whether the library is loaded (without loading it)."""
    return _native is not None


def _load() -> ModuleType:
    global _native
    with _lock:
        if _native is None:
            if not _callbacks:  # the package's __init__ sets them before anything can load
                raise RuntimeError("dynamo_ctx._lib: the package's callbacks are not set (see set_callbacks)")
            from dynamo_ctx import _native as mod  # noqa: PLC0415 - lazy on purpose

            mod._register_callbacks(**_callbacks)
            mod.log_set_level(logger.getEffectiveLevel() or logging.WARNING)
            threading.Thread(target=_pump_logs, args=(mod,), name="dynamo_ctx-log", daemon=True).start()
            _native = mod
        return _native


def _pump_logs(mod: ModuleType) -> None:
    """Forward the library's log records to the ``dynamo_ctx`` logger."""
    fd = mod.log_fd()
    while True:
        select.select([fd], [], [])  # blocks without the GIL
        try:
            _forward(mod)
        except RuntimeError:  # used after fork: nothing more to forward
            return


def _forward(mod: ModuleType) -> None:
    with _log_lock:
        for level, message in mod.log_drain():
            logger.log(level, "%s", message)


def drain_logs() -> None:
    """Forward waiting log records now (tests use it to avoid waiting on the thread)."""
    _forward(native())


def set_native_log_level(level: int) -> None:
    """Set the lowest level of the records the library produces.

    At load the library takes the ``dynamo_ctx`` logger's effective level;
    call this after lowering that logger's level at run time.
    """
    native().log_set_level(level)


def _release(obj: Any, free: str) -> None:
    """Free ``obj``'s native handle once, from ``__del__``: quietly, since at
    interpreter shutdown or in a forked child the library may refuse."""
    h, obj._handle = getattr(obj, "_handle", None), None
    if h is not None:
        try:
            getattr(obj._lib, free)(h)
        except Exception:  # noqa: BLE001
            pass
