"""dynamo_ctx: request cancellation for Python LLM inference backends, with a Go core.

Importing this package does not load the native library; the first Context
or DistributedRuntime created does (see ``dynamo_ctx._lib``), so processes
may still fork until then.
"""

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

__version__ = "0.1.0"

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
