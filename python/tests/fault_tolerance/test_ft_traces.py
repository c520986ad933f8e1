"""Traces: the spans of one request across the frontend and the workers, as processes,
exported over OTLP to a real receiver (the OpenTelemetry Collector's otlpreceiver:
harness.OtlpSink), with the client's traceparent; and none without OTEL_* set.

docs/design.md ("Traces") is the contract these check: one trace per client request,
the frontend's HTTP span a child of the client's span, one attempt span per attempt
under it, the worker's handler span under its attempt, the engine's span under the
handler, a decode worker's prefill call under its handler; and the cancellation's
events (kill with its reason, abort confirmed, KV blocks freed).
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Dict, List

import pytest

from harness import OtlpSink, otel_env

pytestmark = pytest.mark.slow

Span = Dict[str, Any]


@pytest.fixture
def sink(tmp_path):
    s = OtlpSink(tmp_path / "spans.jsonl", log_dir=tmp_path / "logs")
    try:
        yield s
    finally:
        s.stop()


def client_traceparent():
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def traced(stack, sink, workers, **start):
    """Start the stack with every process exporting to ``sink``, each as its own service."""
    stack.env.update(otel_env(sink.endpoint, "frontend"))
    for i, w in enumerate(workers):
        w["env"] = dict(w.get("env", {}), OTEL_SERVICE_NAME=f"worker-{w.get('mode', 'agg')}-{i}")
    return stack.start(workers, **start)


def of(spans: List[Span], trace_id: str) -> List[Span]:
    return [s for s in spans if s["trace_id"] == trace_id]


def one(spans: List[Span], **match: Any) -> Span:
    found = [s for s in spans if all(s.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [(s["service"], s["name"], s["kind"]) for s in spans])
    return found[0]


def children(spans: List[Span], parent: Span, **match: Any) -> List[Span]:
    return [s for s in spans if s["parent_span_id"] == parent["span_id"] and all(s.get(k) == v for k, v in match.items())]


def events(span: Span, name: str) -> List[Dict[str, Any]]:
    return [e for e in span["events"] if e["name"] == name]


def test_trace_of_a_cancelled_disaggregated_request(stack, sink):
    """A streamed completion with the client's traceparent, disaggregated (prefill, then
    decode), cancelled by the client's disconnect mid-stream: one trace, every hop's span
    under the right parent across the three processes, the kill with its reason and the
    abort's confirmation on the decode worker's handler span."""
    traced(stack, sink, [{"mode": "prefill"}, {"mode": "decode", "decode": 0.01}])
    trace_id, client_span, traceparent = client_traceparent()
    rid = stack.new_id("traced")
    body = {"model": stack.model, "prompt": "Trace me a very long answer.", "max_tokens": 5000}
    with stack.open_stream(body, {"x-request-id": rid, "traceparent": traceparent}) as stream:
        for _ in range(5):
            assert stream.event() is not None
    # The client is gone: the decode worker aborts, then confirms it.
    stack.worker("decode").wait_log(rf"Aborted Request ID: {re.escape(rid)}(?: |$)")

    def complete(spans: List[Span]) -> bool:
        mine = of(spans, trace_id)
        handler = [s for s in mine if s["kind"] == "Server" and s["service"] == "worker-decode-1"]
        return len(mine) >= 7 and bool(handler) and bool(events(handler[0], "dynamo_ctx.abort_confirmed"))

    spans = of(sink.wait_spans(complete, "the cancelled request's spans"), trace_id)
    name = f"text_completion {stack.model}"

    http = one(spans, service="frontend", kind="Server")
    assert http["parent_span_id"] == client_span, "the frontend's span is the client's span's child"
    assert http["name"] == "POST /v1/completions"
    assert http["attributes"]["http.request.method"] == "POST"
    assert http["attributes"]["http.route"] == "/v1/completions"
    assert http["attributes"]["gen_ai.operation.name"] == "text_completion"
    assert http["attributes"]["gen_ai.request.model"] == stack.model
    assert http["attributes"]["gen_ai.request.max_tokens"] == 5000
    assert http["attributes"]["dynamo_ctx.request_id"] == rid
    kills = events(http, "dynamo_ctx.kill")
    assert [k["attributes"]["dynamo_ctx.reason"] for k in kills] == ["client_disconnected"]

    (attempt,) = children(spans, http, kind="Client")
    assert attempt["service"] == "frontend" and attempt["name"] == name
    assert attempt["attributes"]["dynamo_ctx.attempt"] == 0

    (decode,) = children(spans, attempt, kind="Server")
    assert decode["service"] == "worker-decode-1" and decode["name"] == name
    kill = events(decode, "dynamo_ctx.kill")
    assert [k["attributes"]["dynamo_ctx.reason"] for k in kill] == ["client_disconnected"]
    assert len(events(decode, "dynamo_ctx.abort_confirmed")) == 1
    (freed,) = events(decode, "dynamo_ctx.kv_blocks_freed")
    assert freed["attributes"]["count"] > 0
    assert decode["attributes"]["dynamo_ctx.outcome"] == "killed"

    (engine,) = children(spans, decode, kind="Internal")
    assert engine["service"] == "worker-decode-1" and engine["name"] == name
    assert engine["attributes"]["gen_ai.usage.output_tokens"] >= 4

    # The decode worker's prefill call: an attempt of its own, a client span under
    # its handler, then the prefill worker's handler and engine.
    (prefill_call,) = children(spans, decode, kind="Client")
    assert prefill_call["service"] == "worker-decode-1" and prefill_call["attributes"]["dynamo_ctx.outcome"] == "completed"
    (prefill,) = children(spans, prefill_call, kind="Server")
    assert prefill["service"] == "worker-prefill-0" and prefill["attributes"]["dynamo_ctx.outcome"] == "completed"
    (prefill_engine,) = children(spans, prefill, kind="Internal")
    assert prefill_engine["attributes"]["gen_ai.usage.output_tokens"] == 1
    assert prefill_engine["attributes"]["gen_ai.response.finish_reasons"] == ["length"]


def test_trace_of_a_migrated_request(stack, sink):
    """A worker SIGKILLed mid-stream with migration on: two attempt spans under the one
    HTTP span (the first failed), the migration noted on it, and the surviving worker's
    handler and engine spans under the second attempt."""
    traced(stack, sink, [{"mode": "agg", "decode": 0.01}, {"mode": "agg", "decode": 0.01}], migration_limit=2)
    trace_id, client_span, traceparent = client_traceparent()
    rid = stack.new_id("traced-migration")
    body = {"model": stack.model, "prompt": "Count on, whatever happens.", "max_tokens": 60}
    got = 0
    with stack.open_stream(body, {"x-request-id": rid, "traceparent": traceparent}) as stream:
        while stream.event() is not None:
            got += 1
            if got == 10:
                busy = [w for w in stack.workers if w.metrics()["dynamo_ctx_worker_running_requests"] == 1]
                assert len(busy) == 1
                busy[0].kill()
    (dead,) = [w for w in stack.workers if not w.running()]
    (survivor,) = [w for w in stack.workers if w.running()]
    survivor_service = f"worker-agg-{stack.workers.index(survivor)}"

    def complete(spans: List[Span]) -> bool:
        # Each process exports its spans in batches as they end: the survivor's engine
        # span ends before its handler's, and may reach the sink in an earlier batch.
        mine = of(spans, trace_id)
        wanted = {("frontend", "Server"), (survivor_service, "Server"), (survivor_service, "Internal")}
        return wanted <= {(s["service"], s["kind"]) for s in mine}

    spans = of(sink.wait_spans(complete, "the migrated request's spans"), trace_id)
    http = one(spans, service="frontend", kind="Server")
    assert http["parent_span_id"] == client_span
    assert http["attributes"]["gen_ai.response.finish_reasons"] == ["length"]
    assert http["attributes"]["gen_ai.usage.output_tokens"] == 60
    (migrated,) = events(http, "dynamo_ctx.migrated")
    assert migrated["attributes"]["dynamo_ctx.attempt"] == 0

    attempts = sorted(children(spans, http, kind="Client"), key=lambda s: s["attributes"]["dynamo_ctx.attempt"])
    assert [a["attributes"]["dynamo_ctx.attempt"] for a in attempts] == [0, 1], "one span per attempt"
    assert attempts[0]["status_code"] == "Error" and attempts[0]["attributes"]["dynamo_ctx.outcome"] == "failed"
    assert attempts[1]["attributes"]["dynamo_ctx.outcome"] == "completed"
    # The dead worker's handler span never ended (SIGKILL), so it was never exported;
    # the survivor's handler span is the second attempt's child.
    assert dead.returncode == -9
    assert children(spans, attempts[0], kind="Server") == []
    (handler,) = children(spans, attempts[1], kind="Server")
    assert handler["service"] == survivor_service and handler["attributes"]["dynamo_ctx.outcome"] == "completed"
    (engine,) = children(spans, handler, kind="Internal")
    assert engine["attributes"]["gen_ai.response.finish_reasons"] == ["length"]


def test_no_spans_without_an_endpoint_or_when_disabled(stack, sink):
    """Tracing is off unless configured: a process with no OTLP endpoint, one with
    OTEL_SDK_DISABLED=true and one with OTEL_TRACES_EXPORTER=none export nothing, even
    after a request with a traceparent and their shutdown's flush."""
    stack.env.update(otel_env(sink.endpoint, "frontend"), OTEL_SDK_DISABLED="true")
    no_endpoint = {k: "" for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED")}
    stack.start([{"mode": "agg", "env": no_endpoint}, {"mode": "agg", "env": {"OTEL_TRACES_EXPORTER": "none", "OTEL_SDK_DISABLED": ""}}])
    _, _, traceparent = client_traceparent()
    for i in range(4):  # round robin: both workers serve
        status, _, body = stack.frontend.request_json("POST", "/v1/completions", {"model": stack.model, "prompt": "hi", "max_tokens": 3},
                                                      headers={"traceparent": traceparent, "x-request-id": stack.new_id(f"untraced{i}")})
        assert status == 200, body
    for p in reversed(stack.procs):  # a flush at shutdown would send whatever was queued
        assert p.stop() is None
    assert sink.spans() == []
