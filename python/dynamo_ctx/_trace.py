"""The host's spans, made by the library (internal).

The library makes and exports every span (OpenTelemetry over OTLP, as the
``OTEL_*`` variables say; off without an endpoint): these put the engine's
work under the span of a worker's handler, which the library attached to
the request's context. While tracing is off each call is a flag read in C:
no call into the library, no JSON.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from ._lib import native

#: Events of a cancellation, as the library names them (docs/design.md, "Traces").
KV_BLOCKS_FREED = "dynamo_ctx.kv_blocks_freed"


def _attrs(attributes: Optional[Mapping[str, Any]]) -> Optional[bytes]:
    return json.dumps(attributes).encode() if attributes else None


def span_start(context: Any, attributes: Optional[Mapping[str, Any]] = None, name: str = "") -> int:
    """Start a span under ``context``'s span; its handle, 0 when not traced.

    An empty ``name`` is the parent's GenAI name ("{operation} {model}").
    """
    lib = native()
    if not lib.trace_enabled():
        return 0
    return int(lib.trace_span_start(context._handle(), name, _attrs(attributes)))


def span_end(span: int, attributes: Optional[Mapping[str, Any]] = None, failed: bool = False) -> None:
    """End the span ``span_start`` returned (nothing for 0)."""
    if span:
        native().trace_span_end(span, _attrs(attributes), failed)


def context_event(context: Any, name: str, attributes: Optional[Mapping[str, Any]] = None) -> None:
    """Add an event to ``context``'s span, if it has one."""
    lib = native()
    if lib.trace_enabled():
        lib.trace_context_event(context._handle(), name, _attrs(attributes))
