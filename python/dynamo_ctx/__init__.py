"""dynamo_ctx: request cancellation for Python LLM inference backends, with a Go core.

Importing this package does not load the native library; the first Context
or DistributedRuntime created does (see ``dynamo_ctx._lib``), so processes
may still fork until then.
"""

from .context import Context
from .runtime import (
    Annotated,
    Client,
    Component,
    DistributedRuntime,
    Endpoint,
    Namespace,
    NoResponders,
    ResponseStream,
    RuntimeClosed,
    StreamIncomplete,
)

__version__ = "0.1.0"

__all__ = [
    "Annotated",
    "Client",
    "Component",
    "Context",
    "DistributedRuntime",
    "Endpoint",
    "Namespace",
    "NoResponders",
    "ResponseStream",
    "RuntimeClosed",
    "StreamIncomplete",
    "__version__",
]
