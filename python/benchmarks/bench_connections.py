"""Connections per request, and short requests per second, through the frontend.

    python python/benchmarks/bench_connections.py [--requests 2000] [--concurrency 32]

One mock worker with no delay and the frontend, as processes. Clients keep
their HTTP connections open (keep-alive), so every TCP connection counted
below is the stack's own: the worker's response streams to the frontend and
the NATS connections. After a warm-up, --requests completions of 2 tokens are
sent by --concurrency clients; `ss` counts, before and after, the sockets in
TIME_WAIT and the connections established, both to or from the frontend's
stream port (the other sockets of the machine are not counted).
Reported: new TCP connections and TIME_WAIT sockets per request (0 when the
worker sends every stream over one long-lived connection), and requests per
second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Set, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "fault_tolerance"))
from conftest import Stack  # noqa: E402


def sockets() -> List[Tuple[str, str, str]]:
    """(state, local address, peer address) of every TCP socket on this machine."""
    out = subprocess.run(["ss", "-tanH"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 5:
            rows.append((f[0], f[3], f[4]))
    return rows


def stream_ports(pid: int) -> Set[str]:
    """The ports a process listens on."""
    out = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True, check=True).stdout
    return {line.split()[3].rsplit(":", 1)[1] for line in out.splitlines() if f"pid={pid}," in line}


async def client(host: str, port: int, body: bytes, count: List[int], stop_at: int) -> None:
    """One keep-alive HTTP/1.1 client sending completions until count reaches stop_at."""
    reader, writer = await asyncio.open_connection(host, port)
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    try:
        while count[0] < stop_at:
            count[0] += 1
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:] if h)}
            if b"content-length" in headers:
                data = await reader.readexactly(int(headers[b"content-length"]))
            else:  # chunked
                data = b""
                while True:
                    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                    chunk = await reader.readexactly(size + 2)
                    if size == 0:
                        break
                    data += chunk[:-2]
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
    finally:
        writer.close()


def run(requests: int, concurrency: int) -> None:
    stack = Stack()
    try:
        stack.start([{"decode": 0.0, "prefill": 0.0}])
        assert stack.frontend is not None
        host, port = stack.frontend.host_port
        body = json.dumps({"model": stack.model, "prompt": "tick", "max_tokens": 2}).encode()
        listen = stream_ports(stack.frontend.proc.pid) - {str(port)}

        def snapshot() -> Tuple[int, int]:
            rows = sockets()
            tw = sum(1 for st, a, b in rows if st == "TIME-WAIT" and {a.rsplit(":", 1)[1], b.rsplit(":", 1)[1]} & listen)
            est = sum(1 for st, a, _ in rows if st == "ESTAB" and a.rsplit(":", 1)[1] in listen)
            return tw, est

        async def batch(n: int) -> float:
            count = [0]
            t0 = time.perf_counter()
            await asyncio.gather(*(client(host, port, body, count, n) for _ in range(concurrency)))
            return time.perf_counter() - t0

        asyncio.run(batch(200))  # warm-up: the sessions and caches that stay
        time.sleep(0.5)
        tw0, est0 = snapshot()
        took = asyncio.run(batch(requests))
        tw1, est1 = snapshot()
        print(f"{requests} requests of 2 tokens, {concurrency} concurrent keep-alive clients, 1 mock worker (no delay)")
        print(f"  requests/s                              {requests / took:10.0f}")
        print(f"  TIME_WAIT sockets, before -> after      {tw0:5} -> {tw1:<5}  ({(tw1 - tw0) / requests:.3f} per request)")
        print(f"  connections to the stream port           {est0:5} -> {est1:<5}")
    finally:
        stack.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    a = ap.parse_args()
    run(a.requests, a.concurrency)


if __name__ == "__main__":
    main()
