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
from typing import Any, Optional

from . import DistributedRuntime
from .backends.vllm import AggregatedHandler, DecodeHandler, PrefillHandler, WorkerMetrics
from .mocker import MockAsyncLLM, MockEngineArgs

logger = logging.getLogger("dynamo_ctx.worker")


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dynamo_ctx.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["mock", "vllm"], default="mock")
    p.add_argument("--mode", choices=["agg", "prefill", "decode"], default="agg")
    p.add_argument("--model", default="mock-model")
    p.add_argument("--namespace", default="dynamo")
    p.add_argument("--migration-limit", type=int, default=0)
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus text at /metrics on this port")
    p.add_argument("--metrics-host", default="127.0.0.1")
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


async def serve_metrics(host: str, port: int, metrics: WorkerMetrics, engine: Any) -> asyncio.AbstractServer:
    """A minimal HTTP server for ``GET /metrics`` (Prometheus text format)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            parts = request_line.decode("latin-1").split()
            if len(parts) >= 2 and parts[0] == "GET" and parts[1].split("?")[0] == "/metrics":
                body, status = metrics.render(engine).encode(), "200 OK"
            else:
                body, status = b"not found\n", "404 Not Found"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            await writer.drain()
        finally:
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
        metrics_server = await serve_metrics(args.metrics_host, args.metrics_port, metrics, engine)
    meta = {"model": args.model, "mode": args.mode, "migration_limit": args.migration_limit}
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
