"""dynamo_ctx: request cancellation for Python LLM inference backends, with a Go core.

Importing this package does not load the native library; the first Context
or DistributedRuntime created does (see ``dynamo_ctx._lib``), so processes
may still fork until then.
"""

from . import _aio, _lib, errors
from .context import Context
from .runtime import (
    Annotated,
    BackendCancelled,
    Client,
    Component,
    DistributedRuntime,
    Endpoint,
    HandlerError,
    Namespace,
    NoResponders,
    ResponseStream,
    RuntimeClosed,
    StreamIncomplete,
    dynamo_worker,
)

from typing import Any

# The three Python functions the library's C code calls, told to _lib here: the
# one module that imports both it and them (they import _lib). Importing any
# dynamo_ctx.* module runs this file first, so no road to the library misses it.
_lib.set_callbacks(exception_for=errors._exception_for, flush_local=_aio._flush_local, local_queue=_aio._local_queue)


def __getattr__(name: str) -> Any:
    """``__version__`` is the native library's (read on first access, which
    loads the library: ``import dynamo_ctx`` alone does not)."""
    if name == "__version__":
        from ._lib import native

        version: str = native().version()
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Annotated",
    "BackendCancelled",
    "Client",
    "Component",
    "Context",
    "DistributedRuntime",
    "Endpoint",
    "HandlerError",
    "Namespace",
    "NoResponders",
    "ResponseStream",
    "RuntimeClosed",
    "StreamIncomplete",
    "__version__",
    "dynamo_worker",
]
