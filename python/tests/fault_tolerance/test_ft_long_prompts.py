"""Long prompts on a real nats-server at its defaults (1 MB max_payload, what a cluster an
operator runs has): prompts of 1k, 100k and 1M token ids reach the worker through the
frontend, the long ones fetched by the worker from the frontend instead of riding in
their envelope (docs/request-plane.md, section 5). Before, a prompt past about 168k
token ids got 413: its envelope did not fit the server's limit.
"""

from __future__ import annotations

import json
import urllib.request

from harness import NatsServer, http_request

CONTEXT = 1_100_000
WORKER_ARGS = ["--max-model-len", str(CONTEXT), "--num-gpu-blocks-override", str(CONTEXT // 16 + 1),
               "--max-num-batched-tokens", str(CONTEXT)]


def _in_bytes(server: NatsServer) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/varz", timeout=5) as r:
        return int(json.load(r)["in_bytes"])


def test_long_prompts_past_the_bus_limit(stack):
    server = NatsServer(log_dir=stack.log_dir).start()
    try:
        stack.env["NATS_SERVER"] = server.url
        stack.start([{"mode": "agg", "prefill": 0, "args": WORKER_ARGS}], migration_limit=0,
                    frontend_args=["--max-body-bytes", str(16 << 20)])
        host, port = stack.frontend.host_port
        url = f"http://{host}:{port}/v1/completions"
        for n in (1000, 100_000, 1_000_000):
            ids = [1000 + (i * 7919) % 30000 for i in range(n)]
            body = json.dumps({"model": stack.model, "prompt": ids, "max_tokens": 1}).encode()
            before = _in_bytes(server)
            status, _, resp = http_request("POST", url, body, headers={"Content-Type": "application/json"}, timeout=60)
            on_bus = _in_bytes(server) - before
            assert status == 200, f"{n} tokens: {status} {resp[:300]!r}"
            out = json.loads(resp)
            assert out["usage"]["prompt_tokens"] == n
            assert out["usage"]["completion_tokens"] == 1
            if n >= 100_000:
                # The envelope, not the prompt, went through NATS (plus any heartbeats meanwhile).
                assert on_bus < len(body) // 20, f"{n} tokens: {on_bus} bytes through NATS"
        # Past the body limit: 413 from it.
        status, _, resp = http_request("POST", url, b'{"model":"x","prompt":"' + b"z" * (16 << 20) + b'"}',
                                       headers={"Content-Type": "application/json"}, timeout=60)
        assert status == 413 and b"request_too_large" in resp
    finally:
        server.stop()
