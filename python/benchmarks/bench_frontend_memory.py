"""Frontend memory: per in-flight request, and the worst case for the largest accepted body.

    .venv/bin/python python/benchmarks/bench_frontend_memory.py [--streams 100,1000] [--concurrent 8]

Starts a NATS host, one mock worker that decodes slowly (every stream stays in flight)
and the frontend, all as processes on loopback. Then:

- RSS of the frontend process with 0, then N streaming requests in flight (each client
  has read its first token), for each N of --streams: the growth divided by N is the
  memory per in-flight request (the frontend's goroutines, buffers, contexts, streams,
  and the connection's buffers).
- Peak RSS (VmHWM, reset through /proc/PID/clear_refs before each case) while the
  frontend reads bodies of the largest accepted size (--max-body, 4 MiB by default):
  one body, then --concurrent at once; both a prompt the model's context length refuses
  (400 after parsing: the prompt is never tokenised) and an accepted request (a prompt
  at the context length, padded to the body limit by a field the frontend ignores).

Figures go in docs/benchmarks.md ("Security and memory").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the harness
from harness import Stack, open_stream_async, request_async  # noqa: E402

MODEL = "mem-model"


def status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class MemStack(Stack):
    """The harness's stack: one mock worker and the frontend (its logs at WARNING, as
    measured), up once the frontend lists the model."""

    def __init__(self, decode: float, max_body: int) -> None:
        super().__init__(prefix="mem")
        try:
            self.start([{"model": MODEL, "decode": decode}],
                       frontend_args=["--max-body-bytes", str(max_body), "--log-level", "WARNING"], frontend_log=False)
        except BaseException:
            self.close()
            raise
        assert self.frontend is not None
        self.port = self.frontend.port
        self.model = MODEL

    def rss(self) -> int:
        assert self.frontend is not None
        return status(self.frontend.pid, "VmRSS")


async def open_stream(port: int, body: bytes):
    """A streamed completion held open once its first token has come."""
    return await open_stream_async("127.0.0.1", port, body)


async def in_flight(stack: MemStack, counts: List[int]) -> None:
    body = json.dumps({"model": stack.model, "prompt": "x" * 64, "max_tokens": 1000, "stream": True}).encode()
    # Warm up (first request, first client of the model), then the baseline.
    r, w = await open_stream(stack.port, body)
    w.close()
    await asyncio.sleep(1.0)
    base = stack.rss()
    print(f"in flight: frontend RSS idle {mib(base)}")
    held = []
    for n in counts:
        while len(held) < n:
            batch = [open_stream(stack.port, body) for _ in range(min(100, n - len(held)))]
            held += await asyncio.gather(*batch)
        await asyncio.sleep(1.0)
        rss = stack.rss()
        print(f"in flight: {n:5d} streams  RSS {mib(rss)}  growth {mib(rss - base)}  per request {(rss - base) / n / 1024:.1f} KiB")
    for _, w in held:
        w.close()
    await asyncio.sleep(2.0)
    print(f"in flight: all closed      RSS {mib(stack.rss())}")


async def post(port: int, body: bytes) -> int:
    """One completion on a connection of its own: its status."""
    status, _, _ = await request_async("127.0.0.1", port, "POST", "/v1/completions", body)
    return status


def bodies(model: str, max_body: int, context_len: int):
    """The largest bodies: one the context length refuses, one accepted."""
    refused = json.dumps({"model": model, "prompt": "x" * (max_body - 64), "max_tokens": 1}).encode()
    accepted = {"model": model, "prompt": "x" * (context_len - 1), "max_tokens": 1, "pad": ""}
    accepted["pad"] = "p" * (max_body - len(json.dumps(accepted)) - 1)
    accepted_b = json.dumps(accepted).encode()
    assert len(refused) <= max_body and len(accepted_b) <= max_body
    return (("refused (400)", refused, 400), ("accepted (200)", accepted_b, 200))


async def largest_body(stack: MemStack, name: str, body: bytes, want: int, n: int) -> None:
    """Peak RSS of a fresh frontend while it serves n largest bodies at once."""
    r, w = await open_stream(stack.port, json.dumps({"model": stack.model, "prompt": "warm", "max_tokens": 1, "stream": True}).encode())
    w.close()
    await asyncio.sleep(1.0)
    before = stack.rss()
    reset_peak(stack.frontend.pid)
    codes = await asyncio.gather(*[post(stack.port, body) for _ in range(n)])
    assert all(c == want for c in codes), codes
    peak = status(stack.frontend.pid, "VmHWM")
    print(f"largest body {mib(len(body))} {name}: {n} at once  idle {mib(before)}  peak {mib(peak)}  "
          f"above idle {mib(peak - before)}  per request {mib((peak - before) / n)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", default="100,1000")
    p.add_argument("--concurrent", type=int, default=8)
    p.add_argument("--max-body", type=int, default=4 << 20)
    p.add_argument("--context-len", type=int, default=32768, help="the model's context length (the frontend's default)")
    args = p.parse_args()
    stack = MemStack(decode=1.0, max_body=args.max_body)
    try:
        asyncio.run(in_flight(stack, [int(x) for x in args.streams.split(",")]))
    finally:
        stack.close()
    # Each largest-body case on a fresh frontend: Go keeps freed heap for
    # reuse, so a case after another would look cheaper than it is.
    for name, body, want in bodies(MODEL, args.max_body, args.context_len):
        for n in (1, args.concurrent):
            stack = MemStack(decode=0.001, max_body=args.max_body)
            try:
                asyncio.run(largest_body(stack, name, body, want, n))
            finally:
                stack.close()

if __name__ == "__main__":
    main()
