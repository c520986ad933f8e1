"""Context benchmarks (docs/design.md, Performance targets), printed as ratios and percentiles.

Run with `make bench-py` (or `python python/benchmarks/bench_context.py`).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamo_ctx import Context  # noqa: E402


def best_times(timers: dict, number: int, rounds: int) -> dict:
    """Each timer's best time for ``number`` calls over ``rounds`` rounds. The
    timers alternate so that load from elsewhere hits all alike; the minimum
    of each is its cost."""
    best = {k: float("inf") for k in timers}
    for _ in range(rounds):
        for k, t in timers.items():
            best[k] = min(best[k], t.timeit(number))
    return best


def poll_ratio(number: int = 1_000_000, rounds: int = 15) -> None:
    ctx = Context()
    ev = threading.Event()
    # Exactly what a handler writes once per token: attribute lookup and call.
    timers = {
        "is_stopped": timeit.Timer("ctx.is_stopped()", globals={"ctx": ctx}),
        "is_killed": timeit.Timer("ctx.is_killed()", globals={"ctx": ctx}),
        "event": timeit.Timer("ev.is_set()", globals={"ev": ev}),
    }
    ns = {k: v / number * 1e9 for k, v in best_times(timers, number, rounds).items()}
    print(f"is_stopped():             {ns['is_stopped']:6.1f} ns/call")
    print(f"is_killed():              {ns['is_killed']:6.1f} ns/call")
    print(f"threading.Event.is_set(): {ns['event']:6.1f} ns/call")
    print(f"is_stopped() / Event.is_set() ratio: {ns['is_stopped'] / ns['event']:.2f}  (target: <= 0.8)")


def create_cost(number: int = 200_000, rounds: int = 9) -> None:
    """Context() create + free: what a frontend pays per request."""
    Context()
    timers = {
        "Context()": timeit.Timer("Context()", globals={"Context": Context}),
        "Context(id=...)": timeit.Timer("Context('req-1')", globals={"Context": Context}),
    }
    for k, v in best_times(timers, number, rounds).items():
        print(f"{k + ' create + free:':32s}{v / number * 1e9:6.0f} ns  (target: <= 500 ns)")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def _wake_latency(n: int) -> list:
    loop = asyncio.get_running_loop()
    out = []
    for _ in range(n):
        ctx = Context()
        armed = threading.Event()
        stamp = [0.0]

        def stopper():
            armed.wait()
            stamp[0] = time.perf_counter()
            ctx.stop_generating()

        t = threading.Thread(target=stopper)
        t.start()
        waiter = asyncio.ensure_future(ctx.stopped())
        await asyncio.sleep(0)  # the watch is registered
        loop.call_soon(armed.set)
        await waiter
        out.append(time.perf_counter() - stamp[0])
        t.join()
    return out


def wake_latency(n: int = 2000) -> None:
    lat = asyncio.run(_wake_latency(n))
    us = [x * 1e6 for x in lat]
    print(
        f"stop_generating() on another thread -> awaiting coroutine resumes: "
        f"p50 {pct(us, 50):.1f} us, p99 {pct(us, 99):.1f} us, mean {statistics.mean(us):.1f} us (n={n})"
    )


def churn(n: int = 1_000_000) -> None:
    """A million create/cancel cycles: goroutines, handles and Go heap before and after."""
    import gc

    from dynamo_ctx._lib import native

    lib = native()
    gc.collect()
    before_h, before_s = lib.handle_counts(), lib.runtime_stats(True)
    t0 = time.perf_counter()
    for i in range(n):
        c = Context()
        if i % 2:
            c.kill()
        else:
            c.child().stop_generating()
    del c
    dt = time.perf_counter() - t0
    gc.collect()
    after_h, after_s = lib.handle_counts(), lib.runtime_stats(True)
    print(f"create+cancel+free: {dt / n * 1e9:.0f} ns per cycle (n={n:,}, half with a linked child)")
    print(f"  handles {before_h} -> {after_h}")
    print(f"  goroutines {before_s['goroutines']} -> {after_s['goroutines']}, "
          f"Go heap {before_s['heap_bytes'] / 1e6:.2f} MB -> {after_s['heap_bytes'] / 1e6:.2f} MB")


if __name__ == "__main__":
    poll_ratio()
    create_cost()
    wake_latency()
    churn()
