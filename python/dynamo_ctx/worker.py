"""A worker process: ``python -m dynamo_ctx.worker --engine mock --mode agg --model NAME``.

Serves a vLLM-style handler over the mock engine (or vLLM's ``AsyncLLM`` with
``--engine vllm`` when vLLM is installed) on the request plane, registers the model
with its migration limit, and exposes Prometheus metrics at ``/metrics`` on
``--metrics-port``. Modes: ``agg`` (prefill and decode), ``prefill``, ``decode``
(calls a prefill worker first). Endpoints: ``<namespace>.backend.generate`` for agg and
decode, ``<namespace>.prefill.generate`` for prefill.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any, Dict, Optional

from . import DistributedRuntime
from .backends.vllm import AggregatedHandler, DecodeHandler, PrefillHandler, WorkerMetrics
from .mocker import MockAsyncLLM, MockEngineArgs

logger = logging.getLogger("dynamo_ctx.worker")

#: Defaults of the metrics listener's bounds: a client has this long to send
#: its request line and headers, at most this many connections are served at
#: once (more are closed at once), and a request's head is at most this long.
METRICS_READ_TIMEOUT = 10.0
METRICS_MAX_CONNECTIONS = 64
METRICS_MAX_HEAD = 16 * 1024


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dynamo_ctx.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["mock", "vllm"], default="mock")
    p.add_argument("--mode", choices=["agg", "prefill", "decode"], default="agg")
    p.add_argument("--model", default="mock-model")
    p.add_argument("--namespace", default="dynamo")
    p.add_argument("--migration-limit", type=int, default=0)
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus text at /metrics on this port")
    p.add_argument("--metrics-host", default="127.0.0.1", help="address of the metrics listener (default: loopback only)")
    p.add_argument(
        "--metrics-read-timeout", type=float, default=METRICS_READ_TIMEOUT,
        help="seconds a metrics client has to send its request (default %(default)s)",
    )
    p.add_argument(
        "--metrics-max-connections", type=int, default=METRICS_MAX_CONNECTIONS,
        help="metrics connections served at once; more are closed at once (default %(default)s)",
    )
    p.add_argument(
        "--max-model-len", type=int, default=None,
        help="the model's context length (prompt + max_tokens), published with the instance; the frontend refuses longer requests",
    )
    p.add_argument("--nats-url", default=None, help="NATS address (default: $NATS_SERVER or the embedded default)")
    p.add_argument("--prefill-time-per-token", type=float, default=MockEngineArgs.prefill_time_per_token)
    p.add_argument("--decode-time-per-token", type=float, default=MockEngineArgs.decode_time_per_token)
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def make_engine(args: argparse.Namespace) -> Any:
    if args.engine == "vllm":
        from vllm import AsyncEngineArgs  # type: ignore[import-not-found]
        from vllm.v1.engine.async_llm import AsyncLLM  # type: ignore[import-not-found]

        return AsyncLLM.from_engine_args(AsyncEngineArgs(model=args.model))
    return MockAsyncLLM(
        MockEngineArgs(prefill_time_per_token=args.prefill_time_per_token, decode_time_per_token=args.decode_time_per_token)
    )


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """The request line, after reading (and bounding) the headers."""
    request_line = await reader.readline()
    size = len(request_line)
    while True:
        line = await reader.readline()
        size += len(line)
        if size > METRICS_MAX_HEAD:
            raise ValueError("request head too long")
        if line in (b"\r\n", b"\n", b""):
            return request_line


async def serve_metrics(
    host: str,
    port: int,
    metrics: WorkerMetrics,
    engine: Any,
    read_timeout: float = METRICS_READ_TIMEOUT,
    max_connections: int = METRICS_MAX_CONNECTIONS,
) -> asyncio.AbstractServer:
    """A minimal HTTP server for ``GET /metrics`` (Prometheus text format).

    Each connection gets ``read_timeout`` seconds to send its request line and
    headers (at most ``METRICS_MAX_HEAD`` bytes), else it is closed; beyond
    ``max_connections`` connections at once, new ones are closed unanswered.
    So a client that opens connections and sends nothing holds nothing for
    long.
    """
    active = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal active
        if active >= max_connections:
            writer.close()
            return
        active += 1
        try:
            try:
                request_line = await asyncio.wait_for(_read_head(reader), read_timeout)
            except (asyncio.TimeoutError, ValueError, ConnectionError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
                return
            parts = request_line.decode("latin-1").split()
            if len(parts) >= 2 and parts[0] == "GET" and parts[1].split("?")[0] == "/metrics":
                body, status = metrics.render(engine).encode(), "200 OK"
            else:
                body, status = b"not found\n", "404 Not Found"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            try:
                await asyncio.wait_for(writer.drain(), read_timeout)
            except (asyncio.TimeoutError, ConnectionError):
                pass
        finally:
            active -= 1
            writer.close()

    return await asyncio.start_server(handle, host, port)


async def run(args: argparse.Namespace) -> None:
    runtime = DistributedRuntime(nats_url=args.nats_url)
    engine = make_engine(args)
    metrics = WorkerMetrics(args.model)
    logger.info("migration_limit=%d for model %s", args.migration_limit, args.model)
    if args.mode == "prefill":
        component, handler = "prefill", PrefillHandler(engine, args.model, metrics)
    elif args.mode == "decode":
        prefill_client = await runtime.endpoint(f"{args.namespace}.prefill.generate").client(migration_limit=args.migration_limit)
        logger.info("waiting for a prefill worker")
        await prefill_client.wait_for_instances()
        component, handler = "backend", DecodeHandler(engine, prefill_client, args.model, metrics)
    else:
        component, handler = "backend", AggregatedHandler(engine, args.model, metrics)
    endpoint = runtime.namespace(args.namespace).component(component).endpoint("generate")
    metrics_server = None
    if args.metrics_port is not None:
        metrics_server = await serve_metrics(
            args.metrics_host, args.metrics_port, metrics, engine, args.metrics_read_timeout, args.metrics_max_connections
        )
    meta: Dict[str, Any] = {"model": args.model, "mode": args.mode, "migration_limit": args.migration_limit}
    if args.max_model_len is not None:
        meta["max_model_len"] = args.max_model_len
    serving = asyncio.ensure_future(endpoint.serve_endpoint(handler.generate, metadata=meta))
    instance = await endpoint.serving()
    logger.info("serving %s as instance %d (model %s, mode %s)", endpoint.path, instance, args.model, args.mode)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.shutdown)
    try:
        await serving
    finally:
        if metrics_server is not None:
            metrics_server.close()
        runtime.shutdown()


def main(argv: Optional[list] = None) -> None:
    args = parse_args(argv)
    # [created] is the epoch time in microseconds: benchmarks compare it with
    # the client's clock on the same machine.
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s [%(created).6f] %(levelname)s %(name)s: %(message)s")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
