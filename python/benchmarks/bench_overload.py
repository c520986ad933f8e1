"""Overload: more clients than places, through the frontend.

    python python/benchmarks/bench_overload.py [--clients 400]

Two mock workers (10 ms a token, 50-token completions: 0.5 s each) declare
--max-num-seqs 16 each; the frontend queues up to --max-queued-requests 64.
All clients send one non-streamed completion at once. Reported: how many were
served, how many refused 503 overloaded, and the time to each answer (p50,
p99, max): a refusal must come at once, a served request's time is its wait
in the queue plus its generation. Then the same with clients that give up
(x-request-timeout 1 s): those still queued at 1 s get 504 without ever
reaching a worker (the workers' request counters say so).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the harness
from harness import Stack, error_code, request_async  # noqa: E402

DECODE = 0.01
TOKENS = 50
SEQS = 16
QUEUE = 64


async def post(host: str, port: int, body: dict, headers: Dict[str, str]) -> Tuple[int, str, float]:
    """One completion on a connection of its own: (status, error code or "", seconds)."""
    t0 = time.monotonic()
    status, _, data = await request_async(host, port, "POST", "/v1/completions", body, headers)
    return status, "" if status == 200 else error_code(data), time.monotonic() - t0


def pct(xs: List[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def row(name: str, xs: List[float]) -> str:
    if not xs:
        return f"    {name:26} 0"
    return f"    {name:26} {len(xs):4}  p50 {pct(xs, 50) * 1000:8.1f} ms  p99 {pct(xs, 99) * 1000:8.1f} ms  max {max(xs) * 1000:8.1f} ms"


def run(clients: int, timeout: float) -> None:
    stack = Stack()
    try:
        spec = {"decode": DECODE, "prefill": 0.0, "args": ["--max-num-seqs", str(SEQS)]}
        stack.start([dict(spec), dict(spec)], frontend_args=["--max-queued-requests", str(QUEUE)])
        host, port = stack.frontend.host_port
        body = {"model": stack.model, "prompt": "tick", "max_tokens": TOKENS}

        async def main() -> List[Tuple[int, str, float]]:
            headers = {"x-request-timeout": str(timeout)} if timeout else {}
            return list(await asyncio.gather(*(post(host, port, body, dict(headers, **{"x-request-id": f"o{i}"})) for i in range(clients))))

        results = asyncio.run(main())
        by: Dict[str, List[float]] = {}
        for status, code, took in results:
            by.setdefault("served (200)" if status == 200 else f"{status} {code}", []).append(took)
        started = sum(w.metrics()["dynamo_ctx_worker_requests_total"] for w in stack.workers)
        what = f"clients give up after {timeout:g} s" if timeout else "clients wait"
        print(f"  {clients} clients, 2 workers x {SEQS} places, queue {QUEUE}, {what}: "
              f"{int(started)} reached a worker")
        for name in sorted(by):
            print(row(name, by[name]))
    finally:
        stack.close()


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=400)
    args = ap.parse_args()
    print(f"overload: mock workers at {DECODE * 1000:g} ms a token, {TOKENS}-token completions")
    run(args.clients, 0.0)
    run(args.clients, 1.0)


if __name__ == "__main__":
    cli()
