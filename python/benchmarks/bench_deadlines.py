"""Deadlines at 1,000 concurrent requests: how late each hop's kill comes.

    python python/benchmarks/bench_deadlines.py [--n 1000] [--timeout 2.0]

This process hosts NATS and is the caller; a mock worker process
(``python -m dynamo_ctx.worker``, 50 ms a token, so every request is still
generating at its deadline) serves. The caller sends n streamed requests at
once, each with ``Context(timeout=T)``; the deadline of each is its context's
creation time + T on this machine's clock. Reported, p50/p99/max of (time -
deadline):

- the timers: when each hop's own timer ran (the library's kill trace, set
  by killtrace.py: ``deadline.fired`` marks, in the caller and in the
  worker, whose deadline is the caller's plus the time the request took to
  reach it: a hop's timer that finds its context already killed by the
  caller's kill frame marks nothing);
- caller: the request's context killed, as ``await ctx.killed()`` sees it on the
  caller's event loop (busy with 1,000 streams' tokens);
- worker: the engine's abort confirmed, from the worker's log line ``Aborted
  Request ID: <id>`` and its timestamp (the worker's own timer fired, or the
  caller's kill frame arrived first, whichever came first; both carry the same
  deadline, sent as time left).

The target (docs/design.md, Performance targets): within 5 ms (p99) at every hop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "python" / "tests")]  # the package, the harness

import killtrace  # noqa: E402 - beside this script


def pct(xs: List[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def row(name: str, xs: List[float]) -> str:
    ms = [x * 1000 for x in xs]
    return (f"  {name:28} n={len(ms):5}  p50 {pct(ms, 50):7.2f} ms  p99 {pct(ms, 99):7.2f} ms  max {max(ms):7.2f} ms  "
            f"mean {statistics.mean(ms):6.2f}")


def with_trace() -> None:
    """Re-run this script with a fresh kill-trace file (the library reads the
    variable when it loads)."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix="dc-deadline-trace-")
    os.close(fd)
    try:
        sys.exit(killtrace.run_traced([__file__, *sys.argv[1:]], path))
    finally:
        os.unlink(path)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=2.0)
    args = ap.parse_args()
    from dynamo_ctx import Context, DistributedRuntime
    from harness import Worker, child_env

    host = DistributedRuntime(nats_url="nats://127.0.0.1:0")
    ns = f"dl{os.getpid()}"
    trace = killtrace.enabled()
    worker = Worker("worker", child_env(host.nats_url), namespace=ns, mode=None, model="m",
                    args=["--decode-time-per-token", "0.05", "--prefill-time-per-token", "0"])
    try:
        await worker.ready_async(60)
        client = await host.endpoint(f"{ns}.backend.generate").client()
        await client.wait_for_instances()
        deadlines: Dict[str, float] = {}
        caller_late: List[float] = []

        async def one(i: int) -> None:
            rid = f"dl-{i}"
            ctx = Context(rid, timeout=args.timeout)
            deadlines[rid] = time.time() + args.timeout
            stream = await client.generate({"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 100000}}, context=ctx)

            async def drain() -> None:
                async for _ in stream:
                    pass

            task = asyncio.ensure_future(drain())
            await ctx.killed()
            caller_late.append(time.time() - deadlines[rid])
            await asyncio.wait_for(task, 30)

        await asyncio.gather(*(one(i) for i in range(args.n)))
        t_end = time.monotonic() + 30
        while worker.log_count("Aborted Request ID: dl-") < args.n and time.monotonic() < t_end:
            await asyncio.sleep(0.1)
        worker_late = []
        for ln in worker.lines:
            m = re.search(r"\[(\d+\.\d+)\].*Aborted Request ID: (dl-\d+)(?: |$)", ln.strip())
            if m:
                worker_late.append(float(m.group(1)) - deadlines[m.group(2)])
        print(f"deadlines: {args.n} concurrent streams, timeout {args.timeout} s, mock worker at 50 ms a token")
        if trace:
            await asyncio.sleep(0.2)  # the trace is written every 50 ms
            fired = []
            for ln in Path(trace).read_text().splitlines():
                parts = ln.split()
                if len(parts) == 3 and parts[1] == "deadline.fired" and parts[2] in deadlines:
                    fired.append(int(parts[0]) / 1e9 - deadlines[parts[2]])
            print(row("timers fired (both hops)", fired))
        else:
            print("  (the kill trace is off: the timers' own figures need it; see killtrace.py)")
        print(row("caller: context killed", caller_late))
        if worker_late:
            print(row("worker: abort confirmed", worker_late))
        else:
            print("  worker: no abort line found")
    finally:
        worker.stop(20)
        host.shutdown()


if __name__ == "__main__":
    if not killtrace.enabled():
        with_trace()
    asyncio.run(main())
