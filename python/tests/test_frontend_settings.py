"""The frontend's settings from the environment: read by the library when a
frontend starts (what the command's flags set), not when the library loads."""

from __future__ import annotations

import json

from harness import http_request, new_namespace


def _post(address: str, size: int):
    """POST a body of ``size`` bytes that is not JSON; the status and body."""
    body = (b'{"model":"m","prompt":"' + b"x" * size)[:size]
    status, _, raw = http_request("POST", f"http://{address}/v1/completions", body, {"Content-Type": "application/json"})
    return status, raw


def test_body_limit_from_environment(monkeypatch):
    """The frontend reads DYNAMO_CTX_MAX_BODY_BYTES when it starts (what ``--max-body-bytes`` sets),
    even though the library was loaded before; a value that is not a positive number is refused."""
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
