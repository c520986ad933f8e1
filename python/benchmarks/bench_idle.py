"""What a served endpoint costs its process while nothing happens: CPU and thread
switches per second with no request, then while it holds one request that
sends nothing (the worker's liveness tick and the runtime's own timers are all
that runs). docs/benchmarks.md, "Posted calls".

Run with `python python/benchmarks/bench_idle.py [--seconds S] [--rounds N]`.
The process hosts its own NATS server (an ephemeral port), as a test does.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
from pathlib import Path
from typing import Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from dynamo_ctx import DistributedRuntime  # noqa: E402
from helpers import ServedEndpoint  # noqa: E402


def usage() -> Tuple[float, int]:
    """This process's CPU seconds so far and its voluntary thread switches."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw


async def per_second(seconds: float) -> Tuple[float, float]:
    """CPU ms and voluntary switches per second over ``seconds``."""
    c0, v0 = usage()
    await asyncio.sleep(seconds)
    c1, v1 = usage()
    return (c1 - c0) * 1000 / seconds, (v1 - v0) / seconds


async def main(url: str, seconds: float, rounds: int) -> None:
    async def handler(request, context):
        yield 0
        await context.stopped()

    async with ServedEndpoint(url, handler) as h:
        await asyncio.sleep(0.5)  # serving has settled
        print("| round | state | CPU ms/s | voluntary switches/s |")
        print("|--:|---|--:|--:|")
        for r in range(1, rounds + 1):
            cpu, sw = await per_second(seconds)
            print(f"| {r} | idle | {cpu:.2f} | {sw:.0f} |", flush=True)
            ctx, stream = await h.open()
            await stream.__anext__()
            await asyncio.sleep(0.5)
            cpu, sw = await per_second(seconds)
            print(f"| {r} | holding one request | {cpu:.2f} | {sw:.0f} |", flush=True)
            ctx.stop_generating()
            async for _ in stream:
                pass
            await asyncio.sleep(0.5)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="each measurement's length")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rt = DistributedRuntime(nats_url="nats://127.0.0.1:0")
    try:
        asyncio.run(main(rt.nats_url, args.seconds, args.rounds))
    finally:
        rt.shutdown()
