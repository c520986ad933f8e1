"""Graceful drain under load: a worker serving 500 streams gets SIGTERM.

    python python/benchmarks/bench_drain.py [--streams 500]

A mock worker A (10 ms a token) behind a frontend takes every stream (150
tokens, about 4 s each); then a second worker B starts, and A gets SIGTERM:

1. drain: --drain-timeout 30 and migration limit 0: A leaves discovery, every
   stream finishes on A, A exits 0. Reported: the time from SIGTERM to A's exit,
   and streams lost (not ending with [DONE], or not the expected text): 0 wanted.
2. handover: --drain-timeout 0.5 and migration limit 2: the streams still on A
   after 0.5 s are handed over and continue on B, token-exact. Same figures.

Then a rolling restart: with both workers serving and new streams arriving
steadily, each worker in turn gets SIGTERM and a replacement starts; every
stream must finish whole.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the harness
from harness import Stack, request_async, sse_data  # noqa: E402

TOKENS = 400
DECODE = 0.01


async def stream(host: str, port: int, body: dict, headers: dict) -> List[str]:
    """One streamed completion on a connection of its own: its SSE events' data (none
    when the connection broke: a lost stream)."""
    try:
        _, _, data = await request_async(host, port, "POST", "/v1/completions", dict(body, stream=True), headers)
    except (asyncio.IncompleteReadError, ConnectionError):
        return []
    return sse_data(data)


def lost(events_list: List[List[str]], want: str) -> int:
    n = 0
    for events in events_list:
        if not events or events[-1] != "[DONE]":
            n += 1
            continue
        chunks = [json.loads(e) for e in events if e.startswith("{")]
        if "".join(c["choices"][0]["text"] for c in chunks if c.get("choices")) != want:
            n += 1
    return n


def scenario(name: str, n: int, drain_timeout: float, limit: int) -> None:
    stack = Stack()
    try:
        spec = {"decode": DECODE, "prefill": 0.0, "args": ["--drain-timeout", str(drain_timeout)]}
        stack.start([dict(spec)], migration_limit=limit)
        fe = stack.frontend
        (a,) = stack.workers
        host, port = fe.host_port
        want = stack.expected_text("tick", TOKENS)

        async def main() -> float:
            body = {"model": stack.model, "prompt": "tick", "max_tokens": TOKENS}
            tasks = [asyncio.ensure_future(stream(host, port, body, {"x-request-id": f"{name}-{i}"})) for i in range(n)]
            t_end = time.monotonic() + 30
            while a.metrics()["dynamo_ctx_worker_running_requests"] < n and time.monotonic() < t_end:
                await asyncio.sleep(0.02)
            held = int(a.metrics()["dynamo_ctx_worker_running_requests"])
            await asyncio.get_running_loop().run_in_executor(None, lambda: stack.start([dict(spec)], frontend=False))
            victim = a
            t0 = time.monotonic()
            victim.proc.send_signal(signal.SIGTERM)
            rc = await asyncio.get_running_loop().run_in_executor(None, victim.proc.wait, 120)
            took = time.monotonic() - t0
            results = await asyncio.gather(*tasks)
            print(f"  {name:9} {n} streams ({held} on the worker that got SIGTERM), drain timeout {drain_timeout:g} s, "
                  f"migration limit {limit}: exit {rc} after {took:.2f} s, lost {lost(results, want)}")
            return took

        asyncio.run(main())
    finally:
        stack.close()


def rolling(n_per_s: int, seconds: float) -> None:
    stack = Stack()
    try:
        spec = {"decode": DECODE, "prefill": 0.0, "args": ["--drain-timeout", "10"]}
        stack.start([dict(spec), dict(spec)], migration_limit=0)
        host, port = stack.frontend.host_port
        want = stack.expected_text("tick", TOKENS)

        async def main() -> None:
            body = {"model": stack.model, "prompt": "tick", "max_tokens": TOKENS}
            tasks = []

            async def load() -> None:
                i = 0
                t_end = time.monotonic() + seconds
                while time.monotonic() < t_end:
                    tasks.append(asyncio.ensure_future(stream(host, port, body, {"x-request-id": f"roll-{i}"})))
                    i += 1
                    await asyncio.sleep(1 / n_per_s)

            loader = asyncio.ensure_future(load())
            await asyncio.sleep(1)
            for old in list(stack.workers):
                # A replacement first, as a rolling deploy brings up the new pod before the old goes.
                await asyncio.get_running_loop().run_in_executor(None, lambda: stack.start([dict(spec)], frontend=False))
                old.proc.send_signal(signal.SIGTERM)
                await asyncio.get_running_loop().run_in_executor(None, old.proc.wait, 60)
                stack.workers.remove(old)  # gone: the next replacement waits for the live ones only
            await loader
            results = await asyncio.gather(*tasks)
            print(f"  rolling   {len(results)} streams at {n_per_s}/s while both workers were replaced one by one "
                  f"(drain timeout 10 s, migration limit 0): lost {lost(results, want)}")

        asyncio.run(main())
    finally:
        stack.close()


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=500)
    args = ap.parse_args()
    print(f"graceful drain: mock workers at {DECODE * 1000:g} ms a token, {TOKENS}-token streams")
    scenario("drain", args.streams, 30.0, 0)
    scenario("handover", args.streams, 0.5, 2)
    rolling(40, 6.0)


if __name__ == "__main__":
    cli()
