"""The one harness for tests and benchmarks that start processes.

    procs.py        free ports, child environments, Proc (a child with its own log file:
                    start, wait for a log line or an event, SIGTERM then SIGKILL, kill -9,
                    SIGSTOP/SIGCONT, its log dumped on failure), helper scripts, a fresh
                    interpreter run to its end (run_python)
    http_client.py  GET/POST, raw-socket requests, Prometheus text
    aio_http.py     HTTP/1.1 on asyncio streams: a request per connection, kept-alive
                    connections, a streamed completion held open (benchmarks' clients)
    sse.py          streamed completions read with asyncio (hundreds at once), or one read
                    event by event from a raw socket (SSEStream)
    nats.py         the NATS host (an embedded server in a process of its own) and real
                    nats-server processes (one, or a cluster)
    stack.py        the worker and frontend commands as processes, and a stack of them
    otlp.py         a real OTLP trace receiver (the OpenTelemetry Collector's otlpreceiver,
                    tools/otlpsink) writing the spans it receives to a file

It lives beside the tests (python/tests/harness), not in the package: it is test
code, and the wheel ships none. The tests import it as ``harness`` (pytest puts
python/tests on sys.path through its conftest.py); the benchmarks put python/tests
on sys.path first. Each test keeps to itself: it picks its own ports, NATS address
(a NATS host on an ephemeral port, passed to children as NATS_SERVER), namespace
and request ids.

The shipped demo (dynamo_ctx/examples/demo.py) keeps a small starter of its own,
since the package cannot import from the tests.
"""

from .aio_http import error_code, open_stream_async, read_response, request_async, send_request, sse_data
from .http_client import (
    http_get, http_json, http_request, metric_sums, parse_prometheus, read_all, request_bytes, scrape, send_post,
    split_response,
)
from .nats import NatsCluster, NatsHost, NatsServer, Subscription, nats_server_binary
from .otlp import OtlpSink, otel_env, otlpsink_binary
from .procs import (
    HANG, PY_DIR, ROOT, STARTED, TESTS_DIR, Proc, ProcError, child_env, dump_logs, free_port, keep_logs, log_root,
    private_network, run_python, start_script, wait_until,
)
from .sse import Result, SSEStream, check_streams, stream_completion, streams_through_fault
from .stack import MODEL, Frontend, Stack, Worker, expected_text, expected_tokens, new_id, new_namespace

__all__ = [
    "HANG", "MODEL", "PY_DIR", "ROOT", "STARTED", "TESTS_DIR",
    "Frontend", "NatsCluster", "NatsHost", "NatsServer", "OtlpSink", "Proc", "ProcError", "Result", "SSEStream", "Stack",
    "Subscription", "Worker",
    "child_env", "dump_logs", "error_code", "expected_text", "expected_tokens", "free_port", "http_get", "http_json",
    "http_request", "keep_logs", "log_root", "metric_sums", "nats_server_binary", "new_id", "new_namespace", "otel_env", "otlpsink_binary",
    "open_stream_async", "parse_prometheus", "private_network", "read_all", "read_response", "request_async", "request_bytes", "run_python",
    "scrape", "send_post", "send_request", "split_response", "sse_data", "start_script", "stream_completion",
    "streams_through_fault", "check_streams", "wait_until",
]
