"""The frontend's settings: one typed value handed to the library when a
frontend starts (``FrontendSettings``), whose settings given as text the
library parses; ``HttpFrontend`` without the command takes them from the
environment when it starts, not when the library loads."""

from __future__ import annotations

import json

from harness import http_request, new_namespace


def _post(address: str, size: int):
    """POST a body of ``size`` bytes that is not JSON; the status and body."""
    body = (b'{"model":"m","prompt":"' + b"x" * size)[:size]
    status, _, raw = http_request("POST", f"http://{address}/v1/completions", body, {"Content-Type": "application/json"})
    return status, raw


def test_body_limit_from_environment(monkeypatch):
    """HttpFrontend takes DYNAMO_CTX_MAX_BODY_BYTES from the environment when it starts (as the
    command does without ``--max-body-bytes``), even though the library was loaded before, and
    hands it on in its settings; a value that is not a positive number is refused."""
    from dynamo_ctx import DistributedRuntime
    from dynamo_ctx.frontend import HttpFrontend

    rt = DistributedRuntime(nats_url="nats://127.0.0.1:0")
    namespace = new_namespace("envlimit")
    try:
        monkeypatch.setenv("DYNAMO_CTX_MAX_BODY_BYTES", "1024")
        fe = HttpFrontend(rt, "127.0.0.1", 0, namespace=namespace)
        try:
            status, body = _post(fe.address, 2048)
            assert status == 413, body
            assert json.loads(body)["error"]["code"] == "request_too_large"
            status, body = _post(fe.address, 512)
            assert status == 400, body  # within the limit: read, then refused as not JSON
        finally:
            fe.close()
        monkeypatch.setenv("DYNAMO_CTX_MAX_BODY_BYTES", "lots")
        try:
            HttpFrontend(rt, "127.0.0.1", 0, namespace=namespace).close()
            raise AssertionError("an invalid DYNAMO_CTX_MAX_BODY_BYTES was accepted")
        except (ValueError, OSError, RuntimeError) as e:
            assert "DYNAMO_CTX_MAX_BODY_BYTES" in str(e)
    finally:
        rt.shutdown()


def test_settings_are_one_value_and_nothing_else_is_read(monkeypatch):
    """``HttpFrontend.start`` takes the whole configuration as one value, as the command
    does: the library reads no environment variable for it (a bad one set meanwhile is not
    seen), and a setting it refuses is named as its source gave it."""
    from dynamo_ctx import DistributedRuntime
    from dynamo_ctx.frontend import HttpFrontend
    from dynamo_ctx.cli.frontend import FrontendSettings, Given

    rt = DistributedRuntime(nats_url="nats://127.0.0.1:0")
    namespace = new_namespace("settings")
    try:
        monkeypatch.setenv("DYNAMO_CTX_MAX_BODY_BYTES", "lots")
        monkeypatch.setenv("DYNAMO_CTX_MAX_QUEUED_REQUESTS", "-1")
        settings = FrontendSettings("127.0.0.1:0", namespace, 0, max_body_bytes=Given("1024", "--max-body-bytes"))
        fe = HttpFrontend.start(rt, settings)
        try:
            status, body = _post(fe.address, 2048)
            assert status == 413, body
        finally:
            fe.close()
        bad = FrontendSettings("127.0.0.1:0", namespace, max_idle_connections=Given("0", "--max-idle-connections"))
        try:
            HttpFrontend.start(rt, bad).close()
            raise AssertionError("an invalid max_idle_connections was accepted")
        except ValueError as e:
            assert '--max-idle-connections "0": want a positive number of connections' in str(e)
    finally:
        rt.shutdown()


def test_only_the_command_fits_its_procs():
    """The command's settings fit its process's Go scheduler to its load
    (``adaptive_procs``: its process is the frontend alone); a frontend started
    from the API, which may share its process, does not unless asked; the
    library takes both."""
    from dynamo_ctx._lib import native
    from dynamo_ctx.cli.frontend import FrontendSettings, frontend_settings, parse_args

    command = json.loads(frontend_settings(parse_args([]), {}).to_json())
    assert command["adaptive_procs"] is True
    assert "adaptive_procs" not in json.loads(FrontendSettings("127.0.0.1:0").to_json())
    for s in (frontend_settings(parse_args([]), {}), FrontendSettings("127.0.0.1:0", adaptive_procs=False)):
        native().frontend_check_settings(s.to_json())
