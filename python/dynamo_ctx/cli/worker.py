"""A worker process: ``python -m dynamo_ctx.worker --engine mock --mode agg --model NAME``.

Serves a vLLM-style handler over the mock engine (or vLLM's ``AsyncLLM`` with
``--engine vllm`` when vLLM is installed) on the request plane, registers the model
with its migration limit, and exposes Prometheus metrics at ``/metrics`` and its
readiness at ``/health`` on ``--metrics-port``, from start-up on (before it waits for
NATS or a prefill worker). Modes: ``agg`` (prefill and decode), ``prefill``, ``decode``
(calls a prefill worker first). Endpoints: ``<namespace>.backend.generate`` for agg and
decode, ``<namespace>.prefill.generate`` for prefill.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

from .. import DistributedRuntime
from ..backends.mocker import MockAsyncLLM, MockEngineArgs
from ..backends.vllm import AggregatedHandler, DecodeHandler, PrefillHandler, WorkerMetrics
from . import _common as _cli

logger = logging.getLogger("dynamo_ctx.worker")

DESCRIPTION = """\
Serve a vLLM-style handler over an engine on the request plane.

Modes: agg (prefill and decode in one worker), prefill, decode (calls a
prefill worker first). With --metrics-port, Prometheus metrics are served at
/metrics and readiness at /health (JSON; 503 while the worker waits for NATS
or a prefill worker) from start-up on.
"""

EPILOG = """\
environment: NATS_SERVER (NATS address), DYN_NAMESPACE, DYN_MIGRATION_LIMIT,
DYN_SYSTEM_HOST and DYN_SYSTEM_PORT (metrics listener), DYN_LOG (log level),
DYN_LOGGING_JSONL=1 (JSON lines). A flag given wins over its variable.
"""

#: Defaults of the metrics listener's bounds: a client has this long to send
#: its request line and headers, at most this many connections are held at
#: once (one more closes the oldest still sending its request), and a
#: request's head is at most this long.
METRICS_READ_TIMEOUT = 10.0
METRICS_MAX_CONNECTIONS = 64
METRICS_MAX_HEAD = 16 * 1024


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = _cli.ArgumentParser("python -m dynamo_ctx.worker", DESCRIPTION, EPILOG)
    p.add("--engine", choices=["mock", "vllm"], default="mock", help="the engine: the mock, or vLLM's AsyncLLM")
    p.add("--mode", choices=["agg", "prefill", "decode"], default="agg", help="what this worker does")
    p.add("--model", default="mock-model", help="model name (vLLM loads it)")
    p.add("--namespace", default="dynamo", env="DYN_NAMESPACE", help="namespace of the endpoints")
    p.add(
        "--migration-limit", type=_cli.non_negative_int, default=0, env="DYN_MIGRATION_LIMIT",
        help="times a broken stream of this model may be moved to another worker",
    )
    p.add("--metrics-port", type=_cli.port, env="DYN_SYSTEM_PORT", help="serve /metrics and /health on this port (0: any free port)")
    p.add("--metrics-host", default="127.0.0.1", env="DYN_SYSTEM_HOST", help="address of the metrics listener (loopback only by default)")
    p.add(
        "--metrics-read-timeout", type=_cli.positive_float, default=METRICS_READ_TIMEOUT,
        help="seconds a metrics client has to send its request",
    )
    p.add(
        "--metrics-max-connections", type=_cli.positive_int, default=METRICS_MAX_CONNECTIONS,
        help="metrics connections held at once; one more closes the oldest still sending its request",
    )
    p.add(
        "--max-model-len", type=_cli.positive_int,
        help="the model's context length (prompt + max_tokens), published with the instance; the frontend refuses longer requests",
    )
    p.add("--nats-url", help="NATS address (default: $NATS_SERVER, else nats://127.0.0.1:4222)")
    p.add(
        "--prefill-time-per-token",
        type=_cli.non_negative_float,
        default=MockEngineArgs.prefill_time_per_token,
        help="mock engine: seconds per prompt token",
    )
    p.add(
        "--decode-time-per-token",
        type=_cli.non_negative_float,
        default=MockEngineArgs.decode_time_per_token,
        help="mock engine: seconds per output token",
    )
    p.add_event_loop()
    p.add_logging()
    args = p.parse_args(argv)
    if args.engine == "vllm" and not _cli.engine_available("vllm"):
        p.error("--engine vllm needs vLLM, which is not installed here; install vllm or use --engine mock")
    return args


def make_engine(args: argparse.Namespace) -> Any:
    if args.engine == "vllm":
        from vllm import AsyncEngineArgs  # type: ignore[import-not-found]
        from vllm.v1.engine.async_llm import AsyncLLM  # type: ignore[import-not-found]

        return AsyncLLM.from_engine_args(AsyncEngineArgs(model=args.model))
    return MockAsyncLLM(
        MockEngineArgs(prefill_time_per_token=args.prefill_time_per_token, decode_time_per_token=args.decode_time_per_token)
    )


class Readiness:
    """What the worker waits for before it serves requests (None: nothing, it serves)."""

    def __init__(self, waiting_for: Optional[str]) -> None:
        self.waiting_for = waiting_for

    def render(self) -> Tuple[str, bytes]:
        """The /health answer: status line and JSON body."""
        if self.waiting_for is None:
            return "200 OK", b'{"status":"ready"}\n'
        return "503 Service Unavailable", (json.dumps({"status": "waiting", "waiting_for": self.waiting_for}) + "\n").encode()


def exposition(metrics: WorkerMetrics, engine: Any) -> bytes:
    """/metrics: prometheus_client's default registry (the engine's own
    metrics, e.g. vLLM's, and the process's) followed by this worker's."""
    from prometheus_client import REGISTRY, generate_latest

    return bytes(generate_latest(REGISTRY)) + bytes(generate_latest(metrics.registry(engine)))


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
    readiness: Optional[Readiness] = None,
) -> asyncio.Server:
    """A minimal HTTP server for ``GET``/``HEAD`` of ``/metrics`` (Prometheus
    text, rendered by prometheus_client) and ``/health`` (JSON readiness: 200
    when serving, 503 with what it waits for otherwise).

    Each connection gets ``read_timeout`` seconds to send its request line and
    headers (at most ``METRICS_MAX_HEAD`` bytes), else it is closed. At most
    ``max_connections`` are held at once: one more closes the oldest that is
    still sending its request (so silent connections cannot keep probes out:
    a probe sends its request at once, and is closed only if that many newer
    connections arrive before it has); when every one is being answered, the
    new one is closed unanswered. So a client that opens connections and
    sends nothing holds nothing for long.
    """
    active = 0
    reading: "OrderedDict[asyncio.StreamWriter, None]" = OrderedDict()  # still sending their request, oldest first
    ready = readiness or Readiness(None)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal active
        if active >= max_connections:
            if not reading:
                writer.close()
                return
            oldest, _ = reading.popitem(last=False)
            oldest.transport.abort()  # its handler sees the connection end and returns
        active += 1
        reading[writer] = None
        try:
            try:
                request_line = await asyncio.wait_for(_read_head(reader), read_timeout)
            except (asyncio.TimeoutError, ValueError, ConnectionError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
                return
            finally:
                reading.pop(writer, None)
            if writer.transport.is_closing():
                return  # closed to make room for a newer connection: its request is cut, not answered
            parts = request_line.decode("latin-1").split()
            method = parts[0] if parts else ""
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            ctype = "text/plain; charset=utf-8"
            if method not in ("GET", "HEAD"):
                status, body = "405 Method Not Allowed", b"method not allowed\n"
            elif path == "/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST

                status, body, ctype = "200 OK", exposition(metrics, engine), CONTENT_TYPE_LATEST
            elif path in ("/health", "/ready"):
                (status, body), ctype = ready.render(), "application/json"
            elif path == "/live":
                status, body = "200 OK", b"alive\n"
            else:
                status, body = "404 Not Found", b"not found\n"
            extra = "Allow: GET, HEAD\r\n" if status.startswith("405") else ""
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{extra}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (b"" if method == "HEAD" else body)
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
    loop = asyncio.get_running_loop()
    engine = make_engine(args)
    metrics = WorkerMetrics(args.model)
    readiness = Readiness(f"NATS at {_cli.nats_address(args.nats_url)}")
    metrics_server = None
    if args.metrics_port is not None:
        # First of all: the worker answers /metrics and /health before it waits on anything.
        try:
            metrics_server = await serve_metrics(
                args.metrics_host, args.metrics_port, metrics, engine, args.metrics_read_timeout, args.metrics_max_connections, readiness
            )
        except OSError as e:
            raise _cli.listen_error(e, args.metrics_host, args.metrics_port, "--metrics-port", "--metrics-host") from None
        host, port = metrics_server.sockets[0].getsockname()[:2]
        logger.info("metrics at http://%s:%d/metrics, readiness at /health", host, port)
    runtime: Optional[DistributedRuntime] = None
    handler: Any
    try:
        runtime = await _cli.connect_runtime(args.nats_url)
        logger.info("migration_limit=%d for model %s", args.migration_limit, args.model)
        if args.mode == "prefill":
            component, handler = "prefill", PrefillHandler(engine, args.model, metrics)
        elif args.mode == "decode":
            prefill_path = f"{args.namespace}.prefill.generate"
            prefill_client = await runtime.endpoint(prefill_path).client(migration_limit=args.migration_limit)
            readiness.waiting_for = f"a prefill worker on {prefill_path}"
            logger.info("waiting for a prefill worker")
            await prefill_client.wait_for_instances()
            component, handler = "backend", DecodeHandler(engine, prefill_client, args.model, metrics)
        else:
            component, handler = "backend", AggregatedHandler(engine, args.model, metrics)
        endpoint = runtime.namespace(args.namespace).component(component).endpoint("generate")
        meta: Dict[str, Any] = {"model": args.model, "mode": args.mode, "migration_limit": args.migration_limit}
        if args.max_model_len is not None:
            meta["max_model_len"] = args.max_model_len
        readiness.waiting_for = f"registration of {endpoint.path}"
        serving = asyncio.ensure_future(endpoint.serve_endpoint(handler.generate, metadata=meta))
        instance = await endpoint.serving()
        readiness.waiting_for = None
        logger.info("serving %s as instance %d (model %s, mode %s)", endpoint.path, instance, args.model, args.mode)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, runtime.shutdown)
        await serving
    finally:
        if metrics_server is not None:
            metrics_server.close()
        if runtime is not None:
            runtime.shutdown()


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    _cli.setup_logging(args.log_level, args.log_format)
    _cli.run_command("python -m dynamo_ctx.worker", lambda: run(args), args.log_level == "debug", args.event_loop)


if __name__ == "__main__":
    main()
