"""How the commands (worker, frontend, demo) fail: every failure is one line
on stderr, "<prog>: <what went wrong>; <what to do>", with exit status 2 for
bad arguments (argparse's convention) or 1 for a failure at run time; a
traceback only appears with ``--log-level debug`` (_runner.py). Here: the
errors that carry the status, the exits, and the one-line reports of what
the library refused (a connection, a listener)."""

from __future__ import annotations

import errno
import logging
import os
import sys
from typing import NoReturn, Optional

from .._lib import native


class CommandError(Exception):
    """A failure to report as one line; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


class UsageError(CommandError):
    """Bad arguments: exit status 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 2)


def fail(prog: str, message: str, status: int) -> NoReturn:
    """Print ``<prog>: <message>`` on stderr and exit with ``status``."""
    sys.stderr.write(f"{prog}: {message}\n")
    sys.stderr.flush()
    raise SystemExit(status)


def exit_now(prog: str, message: str, status: int) -> NoReturn:
    """``fail`` without the interpreter's finalization: the logs are flushed and
    the process ends here, its listeners answering until this moment. For a
    process whose state is beyond saving (a worker whose engine died), whose
    finalization could wait seconds on what died."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.write(f"{prog}: {message}\n")
    sys.stderr.flush()
    os._exit(status)


def native_reason(e: BaseException) -> str:
    """What a native error says, without the function's name ("dc_x: a: b" -> "a: b")."""
    text = str(e).strip() or type(e).__name__
    return text.split(": ", 1)[1] if text.startswith("dc_") and ": " in text else text


def _reason(e: BaseException) -> str:
    """The last, most specific part of a native error message ("dc_x: a: b: c" -> "c")."""
    text = str(e).strip() or type(e).__name__
    return text.rsplit(": ", 1)[-1] if text.startswith("dc_") else text


def nats_address(nats_url: Optional[str]) -> str:
    """The NATS address a runtime made with ``nats_url`` uses, for messages.

    The rule is go/natsbus's (the URL given, else $NATS_SERVER, else the
    default address), applied by the library when the runtime connects;
    the commands pass ``nats_url`` through unresolved. They must still know
    the address before there is a runtime to ask (``nats_url`` of a
    DistributedRuntime): the worker's /health names it while the connect
    waits, and a connect that fails names it with its fix. So it is
    restated here, with the library's names for the variable and the
    default."""
    lib = native()
    return nats_url or os.environ.get(lib.NATS_ENV) or lib.DEFAULT_NATS_URL  # type: ignore[no-any-return]


def connect_error(e: BaseException, nats_url: Optional[str], flag: Optional[str] = "--nats-url") -> CommandError:
    """The one-line report of a runtime that could not be created."""
    where = nats_address(nats_url)
    also = f" (or {flag})" if flag else ""
    return CommandError(
        f"cannot reach NATS at {where} ({_reason(e)}); start a NATS server there, or set NATS_SERVER{also} "
        "to one that runs (nats://127.0.0.1:0 runs one inside this process)"
    )


def listen_error(e: BaseException, host: str, port_: int, flag: str, host_flag: str) -> CommandError:
    """The one-line report of a listener that could not start on host:port."""
    text = str(e)
    code = getattr(e, "errno", None)
    if code == errno.EADDRINUSE or "address already in use" in text:
        return CommandError(f"port {port_} is in use; choose another with {flag}")
    if code == errno.EACCES or "permission denied" in text:
        return CommandError(f"port {port_} needs privileges this process lacks; choose one above 1023 with {flag}")
    if code == errno.EADDRNOTAVAIL or "cannot assign requested address" in text or "no such host" in text:
        return CommandError(f"cannot listen on {host}: not an address of this machine; choose another with {host_flag}")
    return CommandError(f"cannot listen on {host}:{port_} ({_reason(e)}); check {host_flag} and {flag}")
