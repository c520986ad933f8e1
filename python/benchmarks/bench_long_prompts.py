"""Long prompts past NATS's payload limit: time and bytes of 1k, 100k and 1M-token prompts.

A real nats-server process at its defaults (1 MB max_payload, what a cluster an operator
runs has), a mock worker whose context length fits a million tokens, and the frontend with
``--max-body-bytes`` raised to fit the largest body. Each prompt is sent as token ids
(``/v1/completions``, ``"prompt": [ids]``, ``max_tokens`` 1), five times after one warm-up,
to a mock worker that prefills at no cost (so the time is the request's way to the worker);
the table gives the body's size, the bytes NATS received for the request (the server's
``in_bytes`` over the request, so discovery heartbeats in that window count too), the
HTTP status, and the median and best time from sending the body to the end of the response.

    python python/benchmarks/bench_long_prompts.py [--sizes 1000,100000,1000000]

Before the worker fetched long requests from the caller, an envelope had to fit the
server's max_payload: a prompt past about 150k token ids was refused with 413.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the harness
from harness import NatsServer, Stack, http_request  # noqa: E402

BODY_LIMIT = 16 << 20
CONTEXT = 1_100_000
# A mock worker whose KV cache holds the longest prompt, and that prefills it in one
# step at no cost: the time measured is the request's way to the worker, not an engine's.
WORKER_ARGS = ["--max-model-len", str(CONTEXT), "--num-gpu-blocks-override", str(CONTEXT // 16 + 1),
               "--max-num-batched-tokens", str(CONTEXT)]


def body(n: int, model: str) -> bytes:
    ids = [1000 + (i * 7919) % 140000 for i in range(n)]  # 4 to 6 digits, as a real vocabulary's
    return json.dumps({"model": model, "prompt": ids, "max_tokens": 1}, separators=(",", ":")).encode()


def in_bytes(server: NatsServer) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/varz", timeout=5) as r:
        return int(json.load(r)["in_bytes"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,100000,1000000")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    server = NatsServer().start()
    try:
        with Stack(prefix="long") as stack:
            stack.env["NATS_SERVER"] = server.url
            stack.start([{"mode": "agg", "prefill": 0, "args": WORKER_ARGS}], migration_limit=0,
                        frontend_args=["--max-body-bytes", str(BODY_LIMIT)])
            host, port = stack.frontend.host_port
            print(f"{'tokens':>9} {'body bytes':>11} {'NATS bytes':>11} {'status':>6} {'median ms':>10} {'best ms':>8}")
            for n in sizes:
                b = body(n, stack.model)
                times, status, bus = [], 0, []
                for i in range(args.runs + 1):
                    before = in_bytes(server)
                    t0 = time.perf_counter()
                    status, _, resp = http_request("POST", f"http://{host}:{port}/v1/completions", b,
                                                   headers={"Content-Type": "application/json"}, timeout=120)
                    took = time.perf_counter() - t0
                    bus.append(in_bytes(server) - before)
                    if i > 0:
                        times.append(took * 1e3)
                    if status != 200:
                        break
                if times:
                    print(f"{n:>9} {len(b):>11} {min(bus):>11} {status:>6} {statistics.median(times):>10.1f} {min(times):>8.1f}")
                else:
                    print(f"{n:>9} {len(b):>11} {min(bus):>11} {status:>6} {'-':>10} {'-':>8}  {resp[:160]!r}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
