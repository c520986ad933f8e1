"""The kill-latency breakdown: where a remote kill's time goes, hop by hop.

With the library's kill trace on (its variable, ``_native.KILL_TRACE_ENV``,
naming a file before the library loads), the Go side appends one line per
hop a kill passes: ``<unix ns> <hop> <request id>``. The benchmark's Python
code adds its own hops to the same file with :func:`mark` (same clock:
CLOCK_REALTIME, one for the whole machine), and :func:`patch_loop` marks
when the event loop's fd callback runs. :func:`report` prints, for each hop,
the median and p99 time from the previous one.
"""

from __future__ import annotations

import atexit
import os
import time
from typing import Dict, List, Optional, Sequence

#: The hops of a kill, in order. Absent ones (no frame in one process) are skipped.
HOPS = [
    ("py.kill", "caller: ctx.kill() called"),
    ("caller.kill_hook", "caller: the context tree reached the plane's hook"),
    ("caller.frame_written", "caller: Kill frame written and flushed"),
    ("worker.frame_read", "worker: its reader read the Kill frame"),
    ("worker.ctx_killed", "worker: the handler's context killed, its fd signalled"),
    ("worker.loop_woke", "worker: the event loop ran the fd's callback"),
    ("worker.drained", "worker: its tokens read from the pipe (in C: no call into Go)"),
    ("worker.handler_woke", "worker: the handler's await resumed"),
]

_path: Optional[str] = None


def enabled() -> Optional[str]:
    """The trace file, if tracing is on in this process."""
    from dynamo_ctx._lib import native

    global _path
    if _path is None:
        _path = os.environ.get(native().KILL_TRACE_ENV) or ""
    return _path or None


def run_traced(args: Sequence[str], path: str) -> int:
    """``python ARGS...`` (a benchmark's run of itself) with the library's
    kill trace appended to ``path`` (its variable set in the child's
    environment: the library reads it when it loads), its output on this
    process's; the child's exit status. Started by the harness (the
    benchmarks put python/tests on sys.path)."""
    from dynamo_ctx._lib import native
    from harness import child_env, run_python

    env = child_env(os.environ.get("NATS_SERVER"), **{native().KILL_TRACE_ENV: path})
    return run_python(*args, env=env, timeout=None, capture=False).returncode


_marks: List[str] = []


def mark(hop: str, rid: str) -> None:
    """Record a hop of the Python side (no-op when tracing is off); the
    marks are written at exit, so that tracing adds no write to what it times."""
    if enabled():
        if not _marks:
            atexit.register(_write)
        _marks.append(f"{time.time_ns()} {hop} {rid}\n")


def _write() -> None:
    path = enabled()
    if path and _marks:
        with open(path, "a") as f:
            f.writelines(_marks)
        _marks.clear()


class _MarkDrain:
    """The library, with a mark after each ``queue_read`` (``worker.drained``):
    the tokens read from the event queue's pipe (in C; a call into Go, which
    must first get a P, only when the pipe overflowed)."""

    def __init__(self, lib) -> None:  # type: ignore[no-untyped-def]
        self._lib = lib

    def queue_read(self, queue, fd, drain_after):  # type: ignore[no-untyped-def]
        tokens = self._lib.queue_read(queue, fd, drain_after)
        mark("worker.drained", "-")
        return tokens

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self._lib, name)


def patch_loop() -> None:
    """Mark every run of the event loop's fd callback (``worker.loop_woke``)
    and the return of its read of the tokens (``worker.drained``)."""
    if not enabled():
        return
    from dynamo_ctx import _aio

    original = _aio._LoopWaker._on_ready

    def on_ready(self):  # type: ignore[no-untyped-def]
        mark("worker.loop_woke", "-")
        lib = self._lib
        self._lib = _MarkDrain(lib)
        try:
            original(self)
        finally:
            self._lib = lib

    _aio._LoopWaker._on_ready = on_ready  # type: ignore[method-assign]


def report(path: str, prefix: str, label: str) -> None:
    """Print the per-hop breakdown of the kills whose ids start with ``prefix``."""
    events: List[tuple] = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                events.append((int(parts[0]), parts[1], parts[2]))
    events.sort()
    # One kill at a time: each kill's hops are the first of each name after
    # its py.kill and before the next one. The loop's marks ("-", without an
    # id) are the last before the handler woke: the loop may wake for other
    # reasons first, and the wake-up that delivered the kill is the last one.
    kills: List[Dict[str, int]] = []
    current: Optional[Dict[str, int]] = None
    for t, hop, rid in events:
        if hop == "py.kill":
            current = {"py.kill": t} if rid.startswith(prefix) else None
            if current is not None:
                kills.append(current)
        elif current is None or "worker.handler_woke" in current:
            continue
        elif rid == "-" or (rid.startswith(prefix) and hop not in current):
            current[hop] = t
    hops = [h for h, _ in HOPS if any(h in k for k in kills)]
    print(f"  {label}: {len(kills)} kills, per hop the time since the previous hop (p50 / p99, us)")
    prev = None
    for hop, what in HOPS:
        if hop not in hops:
            continue
        if prev is not None:
            d = sorted((k[hop] - k[prev]) / 1e3 for k in kills if hop in k and prev in k and k[hop] >= k[prev])
            if d:
                p50, p99 = d[len(d) // 2], d[min(len(d) - 1, int(0.99 * len(d)))]
                print(f"    {hop:<22} {p50:8.1f} {p99:8.1f}   {what}")
        else:
            print(f"    {hop:<22} {'':>8} {'':>8}   {what}")
        prev = hop
    total = sorted((k[prev] - k["py.kill"]) / 1e3 for k in kills if prev in k)
    if total:
        print(f"    {'total':<22} {total[len(total) // 2]:8.1f} {total[min(len(total) - 1, int(0.99 * len(total)))]:8.1f}")
