"""The engine's processes die with the worker, however the worker dies.

vLLM runs its engine in child processes (``VLLM::EngineCore``, and on some platforms
``VLLM::Worker`` under it). A worker that exits cleanly shuts them down; a worker
that is SIGKILLed (an orchestrator's hard stop, the OOM killer) cannot, and they
run on, orphaned: on a GPU they keep its memory, so the worker that replaces the
dead one cannot start. vLLM's own server leaves them behind the same way.

So a worker that serves an engine with processes of its own starts a *reaper*
first: ``python -m dynamo_ctx.cli.reaper PID``, in a session of its own (a signal
to the worker's process group does not take it first), holding the read end of a
pipe whose write end only the worker holds. Every ``SCAN_INTERVAL`` seconds the
reaper records the worker's descendants (their pid and start time, read from
``/proc``). When the pipe reaches end of file, the worker is gone (however it
died: the kernel closes its descriptors): the reaper SIGKILLs every process it
recorded that still runs with the same start time (so a reused pid is never
hit), and every descendant of theirs, then exits. A worker that exits cleanly
closes the pipe too, after its engine has shut down: whatever is still left of
the engine then goes as well.

The reaper reads ``/proc`` only (Linux); elsewhere the worker does without one.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from typing import Dict, IO, List, Optional, Set

#: Seconds between two scans of the worker's descendants: a process the
#: engine started less than this before the worker died may be missed.
SCAN_INTERVAL = 0.25
#: Rounds of kills at the end: each kills what was recorded and what those
#: processes started since the last scan.
KILL_ROUNDS = 3


def start_time(pid: int) -> Optional[int]:
    """The process's start time (clock ticks since boot), None when it does not run."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        if fields[0] == b"Z":
            return None  # a zombie holds nothing
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _children_files(pid: int) -> Optional[List[int]]:
    """``pid``'s children from /proc/PID/task/*/children; None where the kernel has no such files."""
    out: List[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found = False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(c) for c in f.read().split()]
            found = True
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            found = True
    return out if found or not tasks else None


def _parents() -> Dict[int, List[int]]:
    """Every process's children, from each one's /proc/PID/stat (the slow way)."""
    kids: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def descendants(roots: List[int]) -> Set[int]:
    """The processes under ``roots`` (not the roots themselves)."""
    found: Set[int] = set()
    todo = list(roots)
    table: Optional[Dict[int, List[int]]] = None
    while todo:
        pid = todo.pop()
        kids = None if table is not None else _children_files(pid)
        if kids is None:
            if table is None:
                table = _parents()
            kids = table.get(pid, [])
        for k in kids:
            if k not in found and k not in roots:
                found.add(k)
                todo.append(k)
    return found


def reap(watched: int, pipe: IO[bytes]) -> None:
    """Record ``watched``'s descendants until ``pipe`` ends, then kill them."""
    me = os.getpid()
    seen: Dict[int, int] = {}  # pid -> start time
    while True:
        for pid in descendants([watched]):
            if pid != me and pid not in seen:
                t = start_time(pid)
                if t is not None:
                    seen[pid] = t
        ready, _, _ = select.select([pipe], [], [], SCAN_INTERVAL)
        if ready and not os.read(pipe.fileno(), 4096):
            break
    for _ in range(KILL_ROUNDS):
        alive = [pid for pid, t in seen.items() if start_time(pid) == t]
        for pid in descendants(alive):  # what they started since the last scan
            if pid != me and pid not in seen:
                t = start_time(pid)
                if t is not None:
                    seen[pid] = t
                    alive.append(pid)
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def start() -> Optional["subprocess.Popen[bytes]"]:
    """Start this process's reaper (see the module's doc); None where /proc is not there.

    The pipe's write end stays open in this process, never inherited by its
    children (close-on-exec), and is closed by the kernel when it exits."""
    if not os.path.isdir(f"/proc/{os.getpid()}"):
        return None
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dynamo_ctx.cli.reaper", str(os.getpid())],
            stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
        )
    finally:
        os.close(read_end)
    os.set_inheritable(write_end, False)
    # Kept for the life of the process (its end of file is the signal).
    _held.append(write_end)
    return proc


_held: List[int] = []


def main(argv: Optional[List[str]] = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        raise SystemExit("usage: python -m dynamo_ctx.cli.reaper PID  (standard input: a pipe the process PID holds open)")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the worker: the reaper follows its death
    reap(int(args[0]), sys.stdin.buffer)


if __name__ == "__main__":
    main()
