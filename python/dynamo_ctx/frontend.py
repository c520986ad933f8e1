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
read, idle and write-stall deadlines (README, "Listeners").
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from typing import Optional

from ._lib import native
from .runtime import DistributedRuntime

logger = logging.getLogger("dynamo_ctx.frontend")


class HttpFrontend:
    """A running frontend; ``close()`` stops it."""

    def __init__(self, runtime: DistributedRuntime, host: str = "127.0.0.1", port: int = 8000, namespace: str = "dynamo", migration_limit: Optional[int] = None) -> None:
        self._lib = native()
        limit = -1 if migration_limit is None else int(migration_limit)
        self._handle: Optional[int] = self._lib.frontend_start(runtime._h(), f"{host}:{port}", namespace, limit)

    @property
    def address(self) -> str:
        """``host:port`` the frontend listens on."""
        return self._lib.frontend_addr(self._handle)

    def close(self) -> None:
        """Stop serving (requests in flight get up to 5 s)."""
        h, self._handle = self._handle, None
        if h is not None:
            self._lib.frontend_free(h)


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dynamo_ctx.frontend", description=__doc__.split("\n\n")[0])
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--http-host", default="0.0.0.0")
    p.add_argument("--namespace", default="dynamo")
    p.add_argument("--migration-limit", type=int, default=None, help="retries of a broken stream (default: as the workers declare)")
    p.add_argument("--nats-url", default=None)
    p.add_argument(
        "--max-body-bytes", type=int, default=None,
        help="largest request body accepted, in bytes (default: $DYNAMO_CTX_MAX_BODY_BYTES, else 4 MiB); larger ones get 413",
    )
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    if args.max_body_bytes is not None:
        if args.max_body_bytes <= 0:
            raise SystemExit("--max-body-bytes must be positive")
        os.environ["DYNAMO_CTX_MAX_BODY_BYTES"] = str(args.max_body_bytes)  # read by the frontend when it starts
    runtime = DistributedRuntime(nats_url=args.nats_url)
    fe = await asyncio.get_running_loop().run_in_executor(
        None, lambda: HttpFrontend(runtime, args.http_host, args.http_port, args.namespace, args.migration_limit)
    )
    logger.info("frontend listening on http://%s (namespace %s)", fe.address, args.namespace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await loop.run_in_executor(None, fe.close)
        runtime.shutdown()


def main(argv: Optional[list] = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
