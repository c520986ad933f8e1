"""The engine's processes die with the worker, however the worker dies.

vLLM runs its engine in child processes (``VLLM::EngineCore``, and on some platforms
``VLLM::Worker`` under it). A worker that exits cleanly shuts them down; a worker
that is SIGKILLed (an orchestrator's hard stop, the OOM killer) cannot, and they
run on, orphaned: on a GPU they keep its memory, so the worker that replaces the
dead one cannot start. vLLM's own server leaves them behind the same way.

So a worker that serves an engine with processes of its own starts a *reaper*
first, and waits for its first scan: ``python -m dynamo_ctx.cli.reaper PID``, in
a session of its own (a signal to the worker's process group does not take it
first), holding the read end of a pipe whose write end only the worker holds
(close-on-exec, and closed in any child the worker forks: vLLM forks its engine
where it can). The reaper records the worker's descendants (their pid and
start time, read from ``/proc``) every ``SCAN_INTERVAL`` seconds until the
worker says its engine is ready (``poke``: a byte on the pipe, which also asks
for a scan at once); from then on, while they stay the same, at twice the last
interval, up to ``MAX_SCAN_INTERVAL``, and at ``SCAN_INTERVAL`` again after a
change or a poke (a scan costs about a millisecond of CPU: four a second cost
a busy worker a few microseconds per token). When the pipe
reaches end of file, the worker is gone (however it died: the kernel closes its
descriptors): the reaper SIGKILLs every process it recorded that still runs
with the same start time (so a reused pid is never hit), and every descendant
of theirs, then exits. Python multiprocessing's resource tracker, if one is
among them, gets ``TRACKER_GRACE`` seconds to free what the killed processes
leaked (shared memory, semaphores) and exit by itself. A worker that exits
cleanly closes the pipe too, after its engine has shut down: whatever is still
left of the engine then goes as well. The reaper serves only the process that
started it (PID must be its parent, its standard input a pipe).

The reaper reads ``/proc`` only (Linux); elsewhere the worker does without one.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import sys
import time
from typing import IO, Dict, List, Optional, Set, Union

#: Seconds between two scans of the worker's descendants until its first
#: ``poke``, and after a change: a process the worker started less than this
#: before it died may be missed (what a recorded process started is found at
#: the end).
SCAN_INTERVAL = 0.25
#: The longest interval between two scans, reached after a poke while the
#: descendants stay the same (each interval twice the last): a process the
#: worker starts once its engine is ready is recorded up to this late, unless
#: the worker pokes again.
MAX_SCAN_INTERVAL = 4.0
#: Rounds of kills at the end: each kills what was recorded and what those
#: processes started since the last scan; a pause between two rounds.
KILL_ROUNDS = 3
KILL_PAUSE = 0.05
#: Seconds multiprocessing's resource tracker gets to clean up after the
#: killed processes (shared memory, semaphores) and exit, before it is killed.
TRACKER_GRACE = 5.0


def _stat(pid: Union[int, str]) -> List[bytes]:
    """The fields of /proc/PID/stat from the third on (state, ppid, ...); [] when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return []
    # The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'.
    return stat[stat.rfind(b")") + 2:].split()


def start_time(pid: int) -> Optional[int]:
    """The process's start time (clock ticks since boot), None when it does not run."""
    fields = _stat(pid)
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
            ppid = int(_stat(name)[1])
        except (ValueError, IndexError):
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


def _is_resource_tracker(pid: int) -> bool:
    """Whether ``pid`` is Python multiprocessing's resource tracker: it frees the
    shared memory and semaphores its users leaked once they are all gone, and
    then exits by itself."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"resource_tracker" in f.read()
    except OSError:
        return False


def _kill(pids: List[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def reap(watched: int, pipe: IO[bytes], ready: Optional[IO[bytes]] = None) -> None:
    """Record ``watched``'s descendants until ``pipe`` ends, then kill them.

    ``ready``: closed after the first scan (the worker waits for it before it
    starts its engine)."""
    me = os.getpid()
    seen: Dict[int, int] = {}  # pid -> start time
    interval = SCAN_INTERVAL
    poked = False  # the worker's engine is ready: the intervals may grow
    while True:
        now = {pid: start_time(pid) for pid in descendants([watched]) if pid != me}
        changed = any(t is not None and seen.get(pid) != t for pid, t in now.items())
        # A pid the kernel gave to a new process holds the new start time; a
        # process no longer under the worker (its parent died) is kept while it
        # runs; those that ended are forgotten, so this stays small.
        seen = {pid: t for pid, t in seen.items() if pid not in now and start_time(pid) == t}
        seen.update({pid: t for pid, t in now.items() if t is not None})
        if ready is not None:
            ready.close()
            ready = None
        interval = SCAN_INTERVAL if changed or not poked else min(2 * interval, MAX_SCAN_INTERVAL)
        readable, _, _ = select.select([pipe], [], [], interval)
        if readable:
            if not os.read(pipe.fileno(), 4096):
                break  # the worker is gone
            poked = True
            interval = SCAN_INTERVAL / 2  # poked: scan now; the next interval is SCAN_INTERVAL
    trackers: List[int] = []
    for _ in range(KILL_ROUNDS):
        alive = [pid for pid, t in seen.items() if start_time(pid) == t]
        for pid in descendants(alive):  # what they started since the last scan
            t = start_time(pid)
            if pid != me and t is not None and seen.get(pid) != t:
                seen[pid] = t
                alive.append(pid)
        trackers = [pid for pid in alive if _is_resource_tracker(pid)]
        victims = [pid for pid in alive if pid not in trackers]
        if not victims:
            break
        _kill(victims)
        time.sleep(KILL_PAUSE)
    # The resource trackers clean up after the processes just killed, then exit;
    # one that has not within TRACKER_GRACE is killed too.
    deadline = time.monotonic() + TRACKER_GRACE
    while time.monotonic() < deadline:
        trackers = [pid for pid in trackers if start_time(pid) == seen.get(pid)]
        if not trackers:
            return
        time.sleep(KILL_PAUSE)
    _kill(trackers)


def _close_held() -> None:
    """In a child forked from the worker (vLLM forks its engine where it can):
    its copies of the pipe's write end would keep the pipe open after the
    worker died."""
    for fd in _held:
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


#: Seconds a new reaper has to make its first scan before the worker goes on without waiting.
READY_TIMEOUT = 10.0


def start() -> Optional["subprocess.Popen[bytes]"]:
    """Start this process's reaper (see the module's doc) and wait until it
    watches; None where /proc is not there.

    The pipe's write end stays open in this process only: never inherited by
    a child that execs (close-on-exec), closed in a child that forks, and
    closed by the kernel when this process exits."""
    if not os.path.isdir(f"/proc/{os.getpid()}"):
        return None
    read_end, write_end = os.pipe()
    ready_read, ready_write = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dynamo_ctx.cli.reaper", str(os.getpid()), str(ready_write)],
            stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            pass_fds=(ready_write,),
        )
    finally:
        os.close(read_end)
        os.close(ready_write)
    os.set_inheritable(write_end, False)
    os.set_blocking(write_end, False)  # a poke never waits
    # Kept for the life of the process (its end of file is the signal).
    _held.append(write_end)
    global _fork_hook
    if not _fork_hook:
        os.register_at_fork(after_in_child=_close_held)
        _fork_hook = True
    try:
        select.select([ready_read], [], [], READY_TIMEOUT)  # its first scan done (or it died)
    finally:
        os.close(ready_read)
    return proc


def poke() -> None:
    """Tell this process's reaper, if it has one, that the process's engine is
    ready, and ask it to record the process's descendants now: until the first
    poke it scans every ``SCAN_INTERVAL``, after it less often while nothing
    changes. Call it again after starting more processes of its own."""
    for fd in _held:
        try:
            os.write(fd, b"\0")
        except OSError:
            pass  # the pipe is full of pokes yet to be read (a scan is coming), or the reaper is gone


_held: List[int] = []
_fork_hook = False


def main(argv: Optional[List[str]] = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m dynamo_ctx.cli.reaper PID [READY_FD]  (run by PID, its standard input a pipe PID holds open)"
    if len(args) not in (1, 2) or not all(a.isdigit() for a in args):
        raise SystemExit(usage)
    # Only for the process that started it, through a pipe: never a way to
    # kill another process's children (a reaper given a pid not its parent's,
    # or a standard input that ends at once, refuses).
    if int(args[0]) != os.getppid() or not stat.S_ISFIFO(os.fstat(0).st_mode):
        raise SystemExit(usage)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the worker: the reaper follows its death
    ready = os.fdopen(int(args[1]), "wb") if len(args) == 2 else None
    reap(int(args[0]), sys.stdin.buffer, ready)


if __name__ == "__main__":
    main()
