"""The OpenAI-compatible HTTP frontend: ``python -m dynamo_ctx.frontend --http-port 8000``.

The frontend runs inside the shared library (Go's net/http): ``POST
/v1/completions``, ``POST /v1/chat/completions`` (streaming and not), ``GET
/v1/models``, ``GET /health``, ``GET /metrics``. A client that disconnects kills
its request with reason ``client_disconnected``; the workers' abort
confirmations are counted per model, with the time from disconnect to
confirmed abort. See docs/request-cancellation.md.

Bounds: a body over ``--max-body-bytes`` (4 MiB) gets 413, an ``x-request-id``
that is not 1 to 256 bytes of printable UTF-8 gets 400, prompt tokens +
``max_tokens`` over the model's context length get 400; the listener has
read, idle and write-stall deadlines and holds at most
``--max-idle-connections`` (1024) connections not serving a request, closing
the oldest (waiting 1 s or more) past that (README, "Listeners").
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
from typing import Dict, List, Mapping, Optional

from . import _args, _errors, _logging, _runner
from .._lib import native
from ..runtime import DistributedRuntime

logger = logging.getLogger("dynamo_ctx.frontend")


@dataclasses.dataclass(frozen=True)
class Given:
    """A setting as a user gave it: its text, which the library parses (its
    one parser), and where it came from (a flag, ``--max-body-bytes``, or a
    variable, ``DYNAMO_CTX_MAX_BODY_BYTES``), which the library's refusal
    names."""

    text: str
    source: str


@dataclasses.dataclass(frozen=True)
class FrontendSettings:
    """A frontend's configuration as one typed value: what the library's
    frontend starts with (``to_json``; go/frontend/settings.go reads and
    checks it, ``Settings``). A setting left None is the library's default:
    the migration limit the workers declare, the others LIBRARY_SETTINGS'.
    ``adaptive_procs``: fit the process's Go scheduler to its load (one P while
    quiet, the runtime's default once busy; docs/design.md, section 7), for a
    process that is the frontend alone, as the command's is; off unless True."""

    addr: str
    namespace: str = "dynamo"
    migration_limit: Optional[int] = None
    max_body_bytes: Optional[Given] = None
    max_idle_connections: Optional[Given] = None
    request_timeout: Optional[Given] = None
    max_queued_requests: Optional[Given] = None
    adaptive_procs: Optional[bool] = None

    def to_json(self) -> str:
        """The settings given, as the JSON object the library takes."""
        return json.dumps({k: v for k, v in dataclasses.asdict(self).items() if v is not None})


class HttpFrontend:
    """A running frontend; ``close()`` stops it."""

    def __init__(
        self,
        runtime: DistributedRuntime,
        host: str = "127.0.0.1",
        port: int = 8000,
        namespace: str = "dynamo",
        migration_limit: Optional[int] = None,
    ) -> None:
        """Start a frontend on ``runtime``, listening on host:port for the
        workers of ``namespace``; ``migration_limit`` None: as they declare.
        The library's other settings come from their variables in this
        process's environment (LIBRARY_SETTINGS), as the command's do
        without flags. ``start`` takes the whole configuration instead."""
        limit = None if migration_limit is None else int(migration_limit)
        # Not adaptive_procs: this process may be more than the frontend.
        settings = FrontendSettings(f"{host}:{port}", namespace, limit, adaptive_procs=None, **library_settings(os.environ))
        self._start(runtime, settings)

    @classmethod
    def start(cls, runtime: DistributedRuntime, settings: FrontendSettings) -> "HttpFrontend":
        """Start a frontend on ``runtime`` as ``settings`` say, nothing else
        read. A setting the library refuses is ValueError, naming it as its
        source does; a listener that cannot start is OSError."""
        fe = cls.__new__(cls)
        fe._start(runtime, settings)
        return fe

    def _start(self, runtime: DistributedRuntime, settings: FrontendSettings) -> None:
        self._lib = native()
        self._handle: Optional[int] = self._lib.frontend_start(runtime._h(), settings.to_json())

    @property
    def address(self) -> str:
        """``host:port`` the frontend listens on."""
        return self._lib.frontend_addr(self._handle)

    def drain(self, timeout: float) -> None:
        """Stop accepting at once, let the requests in flight finish for up to
        ``timeout`` seconds, then kill the rest with reason ``shutdown`` (their
        clients get a 503 or a last SSE error event) and stop. Blocks; a call
        during a drain ends its wait at once (a second signal)."""
        if self._handle is not None:
            self._lib.frontend_drain(self._handle, float(timeout))

    def close(self) -> None:
        """Stop serving (``drain(5)`` unless drained) and free the frontend."""
        h, self._handle = self._handle, None
        if h is not None:
            self._lib.frontend_free(h)


DESCRIPTION = """\
The OpenAI-compatible HTTP frontend: POST /v1/completions, POST
/v1/chat/completions (streaming and not), GET /v1/models, GET /health,
GET /metrics. A client that disconnects cancels its request on the worker.
"""

EPILOG = """\
environment: NATS_SERVER (NATS address), DYN_HTTP_HOST, DYN_HTTP_PORT,
DYN_NAMESPACE, DYN_MIGRATION_LIMIT, DYNAMO_CTX_MAX_BODY_BYTES,
DYNAMO_CTX_MAX_IDLE_CONNECTIONS, DYNAMO_CTX_REQUEST_TIMEOUT,
DYNAMO_CTX_MAX_QUEUED_REQUESTS, DYN_LOG (log level), DYN_LOGGING_JSONL=1
(JSON lines). A flag given wins over its variable.
"""

PROG = "python -m dynamo_ctx.frontend"

#: The settings the library parses (go/frontend/settings.go, their one
#: parser): FrontendSettings' field, its flag, its variable, its help. Each
#: is handed on as text with where it came from (``library_settings``); the
#: text is not parsed here.
LIBRARY_SETTINGS = (
    ("max_body_bytes", "--max-body-bytes", "DYNAMO_CTX_MAX_BODY_BYTES",
     "largest request body accepted, in bytes (default: 4 MiB); larger ones get 413"),
    (
        "max_idle_connections",
        "--max-idle-connections",
        "DYNAMO_CTX_MAX_IDLE_CONNECTIONS",
        "connections held that are not serving a request (new or kept alive; default: 1024); "
        "past it a new one takes the place of the oldest once that has waited 1 s",
    ),
    (
        "request_timeout",
        "--request-timeout",
        "DYNAMO_CTX_REQUEST_TIMEOUT",
        "seconds every request may take unless its x-request-timeout header says less (default: none); "
        "past it the request is killed at every hop (504, or a last SSE error event, code deadline_exceeded)",
    ),
    (
        "max_queued_requests",
        "--max-queued-requests",
        "DYNAMO_CTX_MAX_QUEUED_REQUESTS",
        "requests of a model that wait for a free place when every worker of it is at its --max-num-seqs "
        "(default: 1024; 0: none); past it the frontend answers 503 overloaded with Retry-After at once",
    ),
)


def library_settings(environ: Mapping[str, str], args: Optional[argparse.Namespace] = None) -> Dict[str, Given]:
    """The library's settings given (LIBRARY_SETTINGS), by field: each one's
    flag in ``args`` when it was given, else its variable in ``environ``
    when that is set and not empty, else none (the library's default). An
    empty flag is a usage error: the library would take it for none."""
    given: Dict[str, Given] = {}
    for field, flag, env, _ in LIBRARY_SETTINGS:
        text = None if args is None else getattr(args, flag.lstrip("-").replace("-", "_"))
        if text == "":
            raise _errors.UsageError(f"argument {flag}: expected a value; see {PROG} --help")
        if text is not None:
            given[field] = Given(text, flag)
        elif environ.get(env, ""):
            given[field] = Given(environ[env], env)
    return given


def frontend_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> FrontendSettings:
    """The command's settings: its flags, else their variables (read by
    ``add_flag`` for the command's own, by ``library_settings`` for the
    library's), else the defaults. The command's process is the frontend
    alone: its Ps are fitted to its load (``adaptive_procs``)."""
    return FrontendSettings(
        f"{args.http_host}:{args.http_port}", args.namespace, args.migration_limit,
        adaptive_procs=True, **library_settings(environ, args)
    )


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = _args.ArgumentParser(PROG, DESCRIPTION, EPILOG)
    p.add("--http-port", type=_args.port, default=8000, env="DYN_HTTP_PORT", help="HTTP port (0: any free port)")
    p.add("--http-host", default="0.0.0.0", env="DYN_HTTP_HOST", help="HTTP address")
    p.add("--namespace", default="dynamo", env="DYN_NAMESPACE", help="namespace whose models are served")
    p.add(
        "--migration-limit",
        type=_args.non_negative_int,
        env="DYN_MIGRATION_LIMIT",
        help="retries of a broken stream (default: as the workers declare)",
    )
    _args.add_nats_url(p)
    for _, flag, env, text in LIBRARY_SETTINGS:
        p.add_library(flag, env=env, help=text)
    _args.add_drain_timeout(
        p, "seconds the requests in flight get to finish after SIGTERM; then they are killed with reason shutdown",
        type=_args.timeout_seconds,
    )
    p.add_event_loop()
    p.add_logging()
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    settings = frontend_settings(args, os.environ)
    try:  # before connecting, so a bad value is what the user hears of first
        native().frontend_check_settings(settings.to_json())
    except ValueError as e:
        raise _errors.UsageError(f"{_errors.native_reason(e)}; see {PROG} --help") from None
    loop = asyncio.get_running_loop()
    runtime = await _runner.connect_runtime(args.nats_url)
    try:
        fe = await loop.run_in_executor(None, lambda: HttpFrontend.start(runtime, settings))
    except OSError as e:
        runtime.shutdown()
        raise _errors.listen_error(e, args.http_host, args.http_port, "--http-port", "--http-host") from None
    except ValueError as e:  # a value the library refuses (a flag's or a variable's)
        runtime.shutdown()
        raise _errors.UsageError(f"{_errors.native_reason(e)}; see {PROG} --help") from None
    logger.info("frontend listening on http://%s (namespace %s)", fe.address, args.namespace)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        logger.info("draining: no new connections; the requests in flight get %g s", args.drain_timeout)
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal: no more waiting
            loop.add_signal_handler(sig, lambda: loop.run_in_executor(None, fe.drain, 0.0))
        await loop.run_in_executor(None, fe.drain, args.drain_timeout)
        logger.info("drained")
    finally:
        await loop.run_in_executor(None, fe.close)
        runtime.shutdown()


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    _logging.setup_logging(args.log_level, args.log_format)
    _runner.run_command(PROG, lambda: run(args), _args.log_level(args.log_level) == "debug", args.event_loop)


if __name__ == "__main__":
    main()
