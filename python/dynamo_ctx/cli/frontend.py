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
import logging
import signal
from typing import List, Optional

from . import _common as _cli
from .._lib import native
from ..runtime import DistributedRuntime

logger = logging.getLogger("dynamo_ctx.frontend")


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
        self._lib = native()
        limit = -1 if migration_limit is None else int(migration_limit)
        self._handle: Optional[int] = self._lib.frontend_start(runtime._h(), f"{host}:{port}", namespace, limit)

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

#: The flags whose settings the library reads from their environment variables
#: and parses (go/frontend/env.go, their one parser): flag, variable, help. A
#: flag given is handed on through its variable as typed
#: (``_cli.hand_to_library``); the variables are not read here.
LIBRARY_FLAGS = (
    ("--max-body-bytes", "DYNAMO_CTX_MAX_BODY_BYTES", "largest request body accepted, in bytes (default: 4 MiB); larger ones get 413"),
    (
        "--max-idle-connections",
        "DYNAMO_CTX_MAX_IDLE_CONNECTIONS",
        "connections held that are not serving a request (new or kept alive; default: 1024); "
        "past it a new one takes the place of the oldest once that has waited 1 s",
    ),
    (
        "--request-timeout",
        "DYNAMO_CTX_REQUEST_TIMEOUT",
        "seconds every request may take unless its x-request-timeout header says less (default: none); "
        "past it the request is killed at every hop (504, or a last SSE error event, code deadline_exceeded)",
    ),
    (
        "--max-queued-requests",
        "DYNAMO_CTX_MAX_QUEUED_REQUESTS",
        "requests of a model that wait for a free place when every worker of it is at its --max-num-seqs "
        "(default: 1024; 0: none); past it the frontend answers 503 overloaded with Retry-After at once",
    ),
)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = _cli.ArgumentParser(PROG, DESCRIPTION, EPILOG)
    p.add("--http-port", type=_cli.port, default=8000, env="DYN_HTTP_PORT", help="HTTP port (0: any free port)")
    p.add("--http-host", default="0.0.0.0", env="DYN_HTTP_HOST", help="HTTP address")
    p.add("--namespace", default="dynamo", env="DYN_NAMESPACE", help="namespace whose models are served")
    p.add(
        "--migration-limit",
        type=_cli.non_negative_int,
        env="DYN_MIGRATION_LIMIT",
        help="retries of a broken stream (default: as the workers declare)",
    )
    _cli.add_nats_url(p)
    for flag, env, text in LIBRARY_FLAGS:
        p.add_library(flag, env=env, help=text)
    _cli.add_drain_timeout(p, "seconds the requests in flight get to finish after SIGTERM; then they are killed with reason shutdown")
    p.add_event_loop()
    p.add_logging()
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    # Read, and checked, by the frontend when it starts.
    given = _cli.hand_to_library(PROG, args, {flag: env for flag, env, _ in LIBRARY_FLAGS})
    try:  # before connecting, so a bad value is what the user hears of first
        native().frontend_check_settings()
    except ValueError as e:
        raise _cli.UsageError(f"{_cli.library_error(e, given)}; see {PROG} --help") from None
    loop = asyncio.get_running_loop()
    runtime = await _cli.connect_runtime(args.nats_url)
    try:
        fe = await loop.run_in_executor(
            None, lambda: HttpFrontend(runtime, args.http_host, args.http_port, args.namespace, args.migration_limit)
        )
    except OSError as e:
        runtime.shutdown()
        raise _cli.listen_error(e, args.http_host, args.http_port, "--http-port", "--http-host") from None
    except ValueError as e:  # a value the library refuses (a flag's or a variable's)
        runtime.shutdown()
        raise _cli.UsageError(f"{_cli.library_error(e, given)}; see {PROG} --help") from None
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
    _cli.setup_logging(args.log_level, args.log_format)
    _cli.run_command(PROG, lambda: run(args), args.log_level == "debug", args.event_loop)


if __name__ == "__main__":
    main()
