"""The frontend's plain HTTP surface over one mock worker: models, health, request ids."""

from __future__ import annotations

import time

from harness import http_get, wait_until


def test_models_health_and_request_id(stack):
    fe = stack.start([{"mode": "agg"}]).frontend

    status, _, models = fe.get_json("/v1/models")
    assert status == 200
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [stack.model]

    status, _, health = fe.get_json("/health")
    assert status == 200
    assert health["status"] == "healthy"
    assert health["models"] == [stack.model]
    assert health["instances"] == 1

    client = fe.openai()
    models = client.models.list()
    assert [m.id for m in models.data] == [stack.model]

    # A given request id is echoed, and is the response's id after "cmpl-".
    rid = stack.new_id("basic")
    prompt = "hello"
    raw = client.completions.with_raw_response.create(
        model=stack.model, prompt=prompt, max_tokens=5, extra_headers={"x-request-id": rid}
    )
    assert raw.headers["x-request-id"] == rid
    completion = raw.parse()
    assert completion.id == "cmpl-" + rid
    assert completion.choices[0].text == stack.expected_text(prompt, 5)
    assert completion.usage.completion_tokens == 5
    assert stack.worker("agg").log_count(rf"New Request ID: {rid}$") == 1

    # x-dynamo-request-id is the alternative header.
    rid2 = stack.new_id("basic-dyn")
    raw = client.chat.completions.with_raw_response.create(
        model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        extra_headers={"x-dynamo-request-id": rid2},
    )
    assert raw.headers["x-request-id"] == rid2
    assert raw.parse().usage.completion_tokens == 3
    assert stack.worker("agg").log_count(rf"New Request ID: {rid2}$") == 1

    # Without one, a fresh id is generated per request, echoed, and used end to end.
    generated = []
    for _ in range(2):
        raw = client.completions.with_raw_response.create(model=stack.model, prompt=prompt, max_tokens=2)
        gid = raw.headers.get("x-request-id")
        assert gid and gid not in (rid, rid2)
        assert raw.parse().id == "cmpl-" + gid
        generated.append(gid)
    assert generated[0] != generated[1]
    for gid in generated:
        stack.worker("agg").wait_log(rf"New Request ID: {gid}$")

    m = fe.metrics()
    assert m["requests"] == 4
    assert m["cancellations"] == 0 and m["confirmed"] == 0
    w = stack.worker("agg").metrics()
    assert w["dynamo_ctx_worker_running_requests"] == 0
    assert w["dynamo_ctx_worker_kv_blocks_in_use"] == 0
    assert w["dynamo_ctx_worker_aborts_confirmed_total"] == 0


def test_metrics_parse_as_prometheus_text(stack):
    """The frontend's and the worker's /metrics are valid Prometheus text
    exposition, as Prometheus's own parser (prometheus_client's) reads it."""
    from prometheus_client.parser import text_string_to_metric_families

    fe = stack.start([{"mode": "agg"}]).frontend
    fe.openai().completions.create(model=stack.model, prompt="metrics", max_tokens=3)

    _, headers, body = http_get(fe.url + "/metrics")
    assert headers.get("Content-Type", "").startswith("text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert fams["dynamo_ctx_frontend_requests"].type == "counter"
    assert [s.value for s in fams["dynamo_ctx_frontend_requests"].samples if s.name.endswith("_total")] == [1.0]
    assert fams["dynamo_ctx_frontend_cancellations"].type == "counter"
    assert fams["dynamo_ctx_frontend_aborts_confirmed"].type == "counter"
    assert fams["go_goroutines"].type == "gauge"

    worker = stack.worker("agg")
    _, _, body = http_get(f"{worker.metrics_url}/metrics")
    wf = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert wf["dynamo_ctx_worker_running_requests"].type == "gauge"
    assert any(n.startswith("dynamo_ctx_worker_aborts_confirmed") for n in wf)


def test_a_quiet_frontend_runs_at_one_p(stack):
    """The frontend command fits the Go scheduler of its process to its load
    (docs/design.md, section 7): quiet for 2 s, it runs at one P, as its
    go_sched_gomaxprocs_threads says, and serves as before (on one CPU the
    runtime's default is one P already)."""
    stack.env.pop("GOMAXPROCS", None)  # a deployment's setting is kept: not this test's
    fe = stack.start([{"mode": "agg"}]).frontend
    wait_until(lambda: fe.raw_metrics()["go_sched_gomaxprocs_threads"] == 1, "one P once quiet", every=0.2)
    client = fe.openai()
    for i in range(3):
        got = client.completions.create(model=stack.model, prompt=f"one P {i}", max_tokens=4)
        assert got.choices[0].text == stack.expected_text(f"one P {i}", 4)


def test_a_given_gomaxprocs_is_left_alone(stack):
    """A GOMAXPROCS set in the frontend's environment is the deployment's:
    the frontend keeps it, quiet or not."""
    stack.env["GOMAXPROCS"] = "3"
    fe = stack.start([{"mode": "agg"}]).frontend
    time.sleep(3)  # past the 2 s of quiet after which a fitted frontend goes to one P
    assert fe.raw_metrics()["go_sched_gomaxprocs_threads"] == 3
