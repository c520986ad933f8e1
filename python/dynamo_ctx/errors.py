"""The exceptions of the request plane, and the one table from the library's
error codes to them (docs/design.md, section 3)."""

from __future__ import annotations

from ._lib import native

__all__ = [
    "StreamIncomplete",
    "HandlerError",
    "BackendCancelled",
    "NoResponders",
    "RuntimeClosed",
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


class _IOFailure(OSError, RuntimeError):
    """DC_EIO: the operating system or the network refused. An OSError, as the
    native module's calls always raised, and a RuntimeError, as a stream's
    errors always were."""


# The one table from the library's error codes (by name, see
# ``_native.ERROR_NAMES``) to exception classes; codes not here raise
# RuntimeError. The native module builds its exceptions here too: the
# package's ``__init__`` tells ``_lib`` of ``_exception_for``, which
# registers it with the module when it loads it.
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
