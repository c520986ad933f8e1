"""Connections per request, and short requests per second, through the frontend.

    python python/benchmarks/bench_connections.py [--requests 2000] [--concurrency 32]

Side by side, one after the other: dynamo_ctx's frontend + one mock worker
with no delay (streams on sessions, the default), the same with a
connection per stream (DYNAMO_CTX_STREAM_CONNECTIONS=per-stream), and, when
a Python with ai-dynamo is at hand ($DYNAMO_PYTHON, see bench_load.py),
Dynamo's frontend + mocker. Clients keep their HTTP connections open
(keep-alive), so every TCP connection counted is the stack's own. After a
warm-up, --requests completions of 2 tokens are sent by --concurrency
clients; `ss` counts, before and after, the sockets in TIME_WAIT and the
connections established, both to or from the ports the stack's frontend and
worker listen on (but the HTTP port; other sockets of the machine are not
counted). Reported: TIME_WAIT sockets and established connections,
requests per second, and each serving process's CPU per request (user +
system time of the frontend, the worker and, for dynamo_ctx, its NATS host,
over the measured requests: the stacks' own cost, whatever the client's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # the harness
from bench_load import cpu_seconds, dynamo_frontend, dynamo_python  # noqa: E402
from harness import Stack, read_response, send_request  # noqa: E402


def sockets() -> List[Tuple[str, str, str]]:
    """(state, local port, peer port) of every TCP socket on this machine."""
    out = subprocess.run(["ss", "-tanH"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 5:
            rows.append((f[0], f[3].rsplit(":", 1)[1], f[4].rsplit(":", 1)[1]))
    return rows


def listening(pids: List[int]) -> Set[str]:
    """The ports the processes (and their children) listen on."""
    out = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True, check=True).stdout
    tree = set(pids)
    for pid in pids:
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        tree.update(int(k) for k in kids)
    return {line.split()[3].rsplit(":", 1)[1] for line in out.splitlines() if any(f"pid={p}," in line for p in tree)}


async def client(host: str, port: int, body: bytes, count: List[int], stop_at: int) -> None:
    """One keep-alive HTTP/1.1 client sending completions until count reaches stop_at."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while count[0] < stop_at:
            count[0] += 1
            send_request(writer, "POST", "/v1/completions", body)
            status, _, data = await read_response(reader)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
    finally:
        writer.close()


async def requests_from(host: str, port: int, body: bytes, n: int, concurrency: int) -> float:
    """``n`` requests of ``body`` from ``concurrency`` keep-alive clients: the seconds they took."""
    count = [0]
    t0 = time.perf_counter()
    await asyncio.gather(*(client(host, port, body, count, n) for _ in range(concurrency)))
    return time.perf_counter() - t0


async def measure(addr: Tuple[str, int], model: str, pids: Dict[str, int], requests: int, concurrency: int) -> Dict[str, float]:
    """Requests per second, sockets before and after, and "cpu_<name>": each
    process's CPU microseconds per request, over ``requests`` requests."""
    host, port = addr
    body = json.dumps({"model": model, "prompt": "tick", "max_tokens": 2}).encode()
    ports = listening(list(pids.values())) - {str(port)}

    def snapshot() -> Tuple[int, int]:
        rows = sockets()
        tw = sum(1 for st, a, b in rows if st == "TIME-WAIT" and {a, b} & ports)
        est = sum(1 for st, a, _ in rows if st == "ESTAB" and a in ports)
        return tw, est

    await requests_from(host, port, body, 200, concurrency)  # warm-up: the connections and caches that stay
    await asyncio.sleep(0.5)
    tw0, est0 = snapshot()
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    took = await requests_from(host, port, body, requests, concurrency)
    cpu = {f"cpu_{name}": (cpu_seconds(pid) - cpu0[name]) / requests * 1e6 for name, pid in pids.items()}
    tw1, est1 = snapshot()
    return {"rps": requests / took, "tw0": tw0, "tw1": tw1, "est0": est0, "est1": est1, **cpu}


def ours(requests: int, concurrency: int, per_stream: bool) -> Dict[str, float]:
    saved = os.environ.get("DYNAMO_CTX_STREAM_CONNECTIONS")
    os.environ["DYNAMO_CTX_STREAM_CONNECTIONS"] = "per-stream" if per_stream else "shared"
    try:
        stack = Stack()
    finally:
        if saved is None:
            os.environ.pop("DYNAMO_CTX_STREAM_CONNECTIONS")
        else:
            os.environ["DYNAMO_CTX_STREAM_CONNECTIONS"] = saved
    stack.env["DYN_LOG"] = "info"  # the worker's default level, as deployed (the harness's logs each request)
    try:
        stack.start([{"decode": 0.0, "prefill": 0.0}])
        assert stack.frontend is not None
        pids = {"frontend": stack.frontend.proc.pid, "worker": stack.workers[0].proc.pid, "nats": stack.nats_host.pid}
        return asyncio.run(measure(stack.frontend.host_port, stack.model, pids, requests, concurrency))
    finally:
        stack.close()


def dynamo(py: str, requests: int, concurrency: int) -> Optional[Dict[str, float]]:
    async def go() -> Optional[Dict[str, float]]:
        async with dynamo_frontend(py, 1e6) as started:
            if started is None:
                return None
            addr, pids, _ = started
            return await measure(addr, "e2e", pids, requests, concurrency)

    return asyncio.run(go())


def cpu_total(r: Dict[str, float]) -> float:
    """The serving processes' CPU microseconds per request, all together."""
    return sum(v for k, v in r.items() if k.startswith("cpu_"))


def line(name: str, r: Dict[str, float], requests: int) -> str:
    cpu = ", ".join(f"{k[4:]} {v:.0f}" for k, v in r.items() if k.startswith("cpu_"))
    return (f"| {name} | {r['rps']:,.0f} | {r['tw0']:.0f} -> {r['tw1']:.0f} ({(r['tw1'] - r['tw0']) / requests:.3f}) "
            f"| {r['est0']:.0f} -> {r['est1']:.0f} | {cpu_total(r):.0f} ({cpu}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    a = ap.parse_args()
    print(f"{a.requests} requests of 2 tokens, {a.concurrency} concurrent keep-alive clients, one mock worker with no delay\n")
    print("| stack | requests/s | TIME_WAIT before -> after (per request) | established before -> after | CPU us per request |")
    print("|---|--:|--:|--:|--:|")
    s = ours(a.requests, a.concurrency, per_stream=False)
    print(line("dynamo_ctx, sessions", s, a.requests), flush=True)
    print(line("dynamo_ctx, a connection per stream", ours(a.requests, a.concurrency, per_stream=True), a.requests), flush=True)
    py = dynamo_python()
    d = dynamo(py, a.requests, a.concurrency) if py else None
    if d is None:
        print("| Dynamo's frontend + mocker | skipped: set DYNAMO_PYTHON (see bench_load.py) | | | |")
        return
    print(line("Dynamo 1.6.1 frontend + mocker", d, a.requests))
    print(f"\nrequests/s, dynamo_ctx (sessions) / Dynamo: {s['rps'] / d['rps']:.2f} (target >= 2)")
    fw = s["cpu_frontend"] + s["cpu_worker"]
    print(f"CPU per request, frontend + worker, dynamo_ctx (sessions) / Dynamo: {fw / cpu_total(d):.2f} (target <= 0.5); "
          f"with our NATS host too: {cpu_total(s) / cpu_total(d):.2f}; "
          f"frontend {s['cpu_frontend'] / d['cpu_frontend']:.2f}, worker {s['cpu_worker'] / d['cpu_worker']:.2f}")


if __name__ == "__main__":
    main()
