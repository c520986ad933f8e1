"""What a thread's wake-up costs on this machine, in CPU, by how long it slept.

A thread waits in ``epoll_wait`` on a pipe; another process writes a byte to
it every GAP, N times. The waiting thread's CPU time (``CLOCK_THREAD_CPUTIME_ID``:
what the kernel charges it, scheduling in included) over the N wake-ups,
divided by N, is the CPU one wake-up costs it, with nothing else to do.

On the project's 2-CPU virtual machine this is what makes a serving process's
CPU per token depend on how far apart the engine's steps are: each step wakes
each of its threads once or more (docs/benchmarks.md, "Where the serving
processes' CPU goes").

Usage: ``python python/benchmarks/bench_wake.py [--wakes N] [--gaps-ms 4,1,0.2]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import select
import time
from typing import List


def _writer(fd: int, wakes: int, gap: float) -> None:
    time.sleep(0.2)  # the reader is waiting by then
    for _ in range(wakes):
        os.write(fd, b"x")
        time.sleep(gap)


def cpu_per_wake(wakes: int, gap: float) -> float:
    """The reader's CPU microseconds per wake-up, woken every ``gap`` seconds."""
    r, w = os.pipe()
    writer = multiprocessing.get_context("fork").Process(target=_writer, args=(w, wakes, gap))
    ep = select.epoll()
    ep.register(r, select.EPOLLIN)
    try:
        writer.start()
        t0 = time.thread_time()
        seen = 0
        while seen < wakes:
            ep.poll()
            seen += len(os.read(r, 4096))
        return (time.thread_time() - t0) / wakes * 1e6
    finally:
        writer.join()
        ep.close()
        os.close(r)
        os.close(w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wakes", type=int, default=1000)
    ap.add_argument("--gaps-ms", default="8,4,1,0.2")
    args = ap.parse_args()
    gaps: List[float] = [float(g) for g in args.gaps_ms.split(",")]
    print("| asleep between wake-ups (ms) | CPU per wake-up (us) |")
    print("|--:|--:|")
    for g in gaps:
        print(f"| {g:g} | {cpu_per_wake(args.wakes, g / 1000):.1f} |")


if __name__ == "__main__":
    main()
