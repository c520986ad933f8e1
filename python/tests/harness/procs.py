"""Processes: free ports, a child process with its own log file, waits on its output.

A ``Proc`` is a child started with ``subprocess.Popen``. A thread per pipe
reads its output line by line into memory (what ``wait_log`` and ``event``
search) and into its own log file (``Proc.log_path``). By default stdout and
stderr are one log; with ``events=True`` stdout is kept apart: the JSON lines
the test scripts print (``{"event": "ready", ...}``) or the URL the NATS host
prints. Waits are bounded by ``HANG``: a wait that long means something
hangs; it fails with ``ProcError`` (an ``AssertionError``) whose message
carries the tail of the log and the log file's path.

Each wait has a blocking form for plain tests and threads, and an ``_async``
form for coroutines: it suspends the caller's task, never its event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

PY_DIR = Path(__file__).resolve().parents[2]  # .../python: the dynamo_ctx package lives here
ROOT = PY_DIR.parent
TESTS_DIR = PY_DIR / "tests"
HANG = 60.0  # seconds: a wait this long means something hangs (bounds catch hangs, they do not time)
TAIL = 200  # log lines a failure message carries

#: Every Proc started in this interpreter, in order. The tests' conftest takes the ones a
#: test started, dumps their logs when the test failed and stops any left running.
STARTED: List["Proc"] = []


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (32768 unless configured)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_port_rng = random.Random()

#: The ports free_port handed out lately (at most _HANDED_KEPT), never handed out
#: again meanwhile: a cluster takes nine before its first node binds any.
_HANDED_KEPT = 4096
_handed: "collections.deque[int]" = collections.deque()
_handed_set: Set[int] = set()


def _hand(port: int) -> int:
    _handed.append(port)
    _handed_set.add(port)
    if len(_handed) > _HANDED_KEPT:
        _handed_set.discard(_handed.popleft())
    return port


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago, for a child to listen on.

    Drawn at random below the kernel's range for outgoing connections' ports, so that
    no connection's source port takes it before the child binds it (which the kernel's
    own pick, from that range, allows: a nats-server then failed with "address already
    in use"), and never one this process handed out lately (``_handed``: two draws
    before either child binds could meet, as a nats-server's route port once met
    another's); the kernel's pick when no port there is free."""
    low = _ephemeral_low()
    for _ in range(64) if low > 11000 else ():
        port = _port_rng.randrange(10000, low)
        if port in _handed_set:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return _hand(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return _hand(s.getsockname()[1])


def child_env(nats_url: Optional[str] = None, base: Optional[Dict[str, str]] = None, **extra: str) -> Dict[str, str]:
    """The environment of a child: ``base`` (default: this process's) with the in-tree
    package first on PYTHONPATH and NATS_SERVER set to ``nats_url``, or removed when it is
    None (a child never inherits the caller's NATS address: each test passes its own);
    ``extra`` is added last."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PY_DIR), env.get("PYTHONPATH")]))
    if nats_url is None:
        env.pop("NATS_SERVER", None)
    else:
        env["NATS_SERVER"] = nats_url
    env.update(extra)
    return env


def wait_until(cond: Callable[[], Any], what: str, timeout: float = HANG, every: float = 0.02,
               ignore: Tuple[type, ...] = (OSError,), fail: bool = True) -> Any:
    """Poll ``cond()`` until it returns a true value and return that value; ``cond``
    raising one of ``ignore`` (a connection refused while a server starts) counts as
    false. Fails after ``timeout`` seconds, or with ``fail=False`` returns None then
    (a check that reports, rather than a test that fails)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = cond()
            if value:
                return value
        except ignore:
            pass
        if time.monotonic() > deadline:
            if not fail:
                return None
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


# ---------------------------------------------------------------- log files

_log_root: Optional[Path] = None
_keep_logs = bool(os.environ.get("DC_KEEP_LOGS"))
_files_lock = threading.Lock()


def log_root() -> Path:
    """The directory of the logs of Procs started without ``log_dir``: one per
    interpreter, removed at exit unless a process failed a wait (or DC_KEEP_LOGS is set)."""
    global _log_root
    with _files_lock:
        if _log_root is None:
            _log_root = Path(tempfile.mkdtemp(prefix="dc-procs-"))
            atexit.register(_remove_log_root)
        return _log_root


def keep_logs() -> None:
    """Keep the default log directory at exit (a failure's logs are worth reading)."""
    global _keep_logs
    _keep_logs = True


def _remove_log_root() -> None:
    if _log_root is not None and not _keep_logs:
        shutil.rmtree(_log_root, ignore_errors=True)


def _new_log_file(log_dir: Optional[Union[str, Path]], name: str) -> Tuple[Path, IO[str]]:
    """``<dir>/<name>.log``, or ``<name>-2.log``, ... when that one exists (never overwritten)."""
    d = Path(log_dir) if log_dir is not None else log_root()
    d.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "proc"
    n = 1
    while True:
        path = d / (f"{safe}.log" if n == 1 else f"{safe}-{n}.log")
        try:
            return path, open(path, "x", buffering=1, encoding="utf-8", errors="replace")
        except FileExistsError:
            n += 1


# ---------------------------------------------------------------- output lines

class ProcError(AssertionError):
    """A process did not do what a test waited for; the message carries its log."""


class _Lines:
    """The lines of one pipe, as they arrive: blocking waiters wait on ``cond``,
    coroutines on futures that the reading thread resolves through their loop."""

    def __init__(self) -> None:
        self.items: List[str] = []
        self.ended = False
        self.cond = threading.Condition()
        self._futures: List[Tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]] = []

    def add(self, line: Optional[str]) -> None:
        """Append ``line``; None: the pipe reached its end."""
        with self.cond:
            if line is None:
                self.ended = True
            else:
                self.items.append(line)
            self.cond.notify_all()
            futures, self._futures = self._futures, []
        for loop, fut in futures:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # its loop has closed: nobody waits any more
                pass

    def future(self) -> "asyncio.Future[None]":
        """A future of the running loop resolved by the next line or the end (hold ``cond``)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._futures.append((loop, fut))
        return fut


def _resolve(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


Finder = Callable[[List[str]], Any]  # the lines so far -> what was waited for, or None


class Proc:
    """A child process with its own log file (``log_path``, under ``log_dir`` or
    ``log_root()``).

    ``stdin=True`` keeps a pipe to its stdin (``close_stdin()``: the NATS host and
    the scripts that serve until their stdin closes). ``events=True`` keeps stdout
    apart from the log (``event``, ``read_line``); otherwise stdout joins stderr.
    ``new_session``: the child leads a session of its own (a terminal's Ctrl-C does
    not reach it).
    """

    def __init__(self, name: str, argv: Sequence[str], env: Optional[Dict[str, str]] = None, *,
                 log_dir: Optional[Union[str, Path]] = None, stdin: bool = False, events: bool = False,
                 cwd: Optional[Union[str, Path]] = None, new_session: bool = False) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path, self._file = _new_log_file(log_dir, name)
        self._file.write(f"# {' '.join(self.argv)}\n")
        self._log = _Lines()
        self._out = _Lines() if events else None
        self._out_pos = 0  # stdout lines consumed by event() and read_line()
        self._open_pipes = 0
        self._file_lock = threading.Lock()  # two reading threads (events=True) share the file
        try:
            self.proc = subprocess.Popen(
                self.argv, env=env, cwd=cwd, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE if events else subprocess.STDOUT,
                text=True, bufsize=1, errors="replace", start_new_session=new_session,
            )
        except BaseException:
            self._file.close()
            raise
        pipes = [(self.proc.stdout, self._log)] if not events else [(self.proc.stderr, self._log), (self.proc.stdout, self._out)]
        self._open_pipes = len(pipes)
        self._threads = [threading.Thread(target=self._read, args=(f, lines), daemon=True, name=f"{name}-{i}")
                         for i, (f, lines) in enumerate(pipes)]
        for t in self._threads:
            t.start()
        STARTED.append(self)

    def __repr__(self) -> str:
        return f"<Proc {self.name} pid={self.proc.pid} rc={self.proc.returncode}>"

    def __enter__(self) -> "Proc":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _read(self, f: IO[str], lines: _Lines) -> None:
        try:
            for line in f:
                lines.add(line)
                with self._file_lock:
                    try:
                        self._file.write(line)
                    except (OSError, ValueError):  # disk full, or closed: the lines in memory still count
                        pass
        finally:
            lines.add(None)
            with self._file_lock:
                self._open_pipes -= 1
                if self._open_pipes == 0:
                    self._file.close()

    # ------------------------------------------------------------ state

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.poll()

    def running(self) -> bool:
        return self.proc.poll() is None

    @property
    def lines(self) -> List[str]:
        """The log's lines so far (a copy)."""
        with self._log.cond:
            return list(self._log.items)

    def log(self) -> str:
        with self._log.cond:
            return "".join(self._log.items)

    def tail(self, n: int = 30) -> str:
        with self._log.cond:
            return "".join(self._log.items[-n:])

    def log_count(self, pattern: str) -> int:
        """How many log lines so far match ``pattern``."""
        rx = re.compile(pattern)
        with self._log.cond:
            return sum(1 for line in self._log.items if rx.search(line))

    def dump(self) -> str:
        """A header and the whole log: what a failed test prints."""
        shown = ["<script>" if "\n" in a else a for a in self.argv[1:4]]
        head = " ".join(shown) + (" ..." if len(self.argv) > 4 else "")
        return f"----- {self.name}: {head} (pid {self.pid}, rc={self.proc.poll()}, log {self.log_path}) -----\n{self.log()}"

    def error(self, what: str) -> ProcError:
        """A ProcError about this process, with the tail of its log."""
        keep_logs()
        with self._log.cond:
            tail = "".join(self._log.items[-TAIL:])
        return ProcError(f"{self.name} (pid {self.pid}, rc={self.proc.poll()}): {what}\n"
                         f"--- last {TAIL} lines of {self.log_path} ---\n{tail}")

    # ------------------------------------------------------------ waits

    def _wait(self, lines: _Lines, find: Finder, what: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        with lines.cond:
            while True:
                found = find(lines.items)
                if found is not None:
                    return found
                if lines.ended:
                    raise self.error(f"its output ended (exit status {self._exit_status()}) before {what}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self.error(f"no {what} within {timeout:g} s")
                lines.cond.wait(min(left, 0.5))

    async def _wait_async(self, lines: _Lines, find: Finder, what: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            with lines.cond:
                found = find(lines.items)
                if found is not None:
                    return found
                if lines.ended:
                    ended = True
                else:
                    ended, fut = False, lines.future()
            if ended:
                rc = await asyncio.get_running_loop().run_in_executor(None, self._exit_status)
                raise self.error(f"its output ended (exit status {rc}) before {what}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.error(f"no {what} within {timeout:g} s")
            await asyncio.wait({fut}, timeout=left)

    def _exit_status(self) -> Optional[int]:
        """The exit status, waiting a little for it (the output ends as the process exits)."""
        try:
            return self.proc.wait(5)
        except subprocess.TimeoutExpired:
            return None

    @staticmethod
    def _log_finder(pattern: str) -> Finder:
        rx = re.compile(pattern)
        seen = [0]

        def find(items: List[str]) -> Optional["re.Match[str]"]:
            for line in items[seen[0]:]:
                m = rx.search(line)
                if m:
                    return m
            seen[0] = len(items)
            return None

        return find

    def wait_log(self, pattern: str, timeout: float = HANG) -> "re.Match[str]":
        """The first log line (since the start) matching ``pattern``, waiting for it;
        fails if the output ends first."""
        return self._wait(self._log, self._log_finder(pattern), f"log line matching {pattern!r}", timeout)

    async def wait_log_async(self, pattern: str, timeout: float = HANG) -> "re.Match[str]":
        return await self._wait_async(self._log, self._log_finder(pattern), f"log line matching {pattern!r}", timeout)

    def _event_finder(self, name: Optional[str]) -> Finder:
        def find(items: List[str]) -> Optional[Dict[str, Any]]:
            while self._out_pos < len(items):
                line = items[self._out_pos]
                self._out_pos += 1
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # not an event
                if isinstance(ev, dict) and (name is None or ev.get("event") == name):
                    return ev
            return None

        return find

    def _stdout(self) -> _Lines:
        if self._out is None:
            raise TypeError(f"{self.name}: started without events=True, its stdout is in its log")
        return self._out

    def event(self, name: Optional[str] = None, timeout: float = HANG) -> Dict[str, Any]:
        """The next JSON event on stdout named ``name`` (``{"event": name, ...}``; any
        event when None), those before it passed over."""
        return self._wait(self._stdout(), self._event_finder(name), f"event {name!r}", timeout)

    async def event_async(self, name: Optional[str] = None, timeout: float = HANG) -> Dict[str, Any]:
        return await self._wait_async(self._stdout(), self._event_finder(name), f"event {name!r}", timeout)

    def read_line(self, timeout: float = HANG) -> str:
        """The next line on stdout (events=True), as printed."""
        def find(items: List[str]) -> Optional[str]:
            if self._out_pos < len(items):
                self._out_pos += 1
                return items[self._out_pos - 1]
            return None

        return self._wait(self._stdout(), find, "line on stdout", timeout)

    def wait(self, timeout: float = HANG) -> int:
        """Wait for the process to exit and its output to be read; its exit status."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise self.error(f"did not exit within {timeout:g} s") from None
        for t in self._threads:
            t.join(timeout)
        return rc

    async def wait_async(self, timeout: float = HANG) -> int:
        return await asyncio.get_running_loop().run_in_executor(None, self.wait, timeout)

    # ------------------------------------------------------------ signals

    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def freeze(self) -> None:
        """SIGSTOP: the process stops running until ``thaw()``."""
        self.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT."""
        self.send_signal(signal.SIGCONT)

    def kill(self, wait: bool = True) -> None:
        """SIGKILL (kill -9), and reap unless ``wait=False``."""
        self.send_signal(signal.SIGKILL)
        if wait:
            self.proc.wait(HANG)

    def close_stdin(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def stop_by_stdin(self, timeout: float = 10.0) -> Optional[str]:
        """Close its stdin (the NATS host and the serving helper scripts then shut down and
        exit); SIGKILL if it has not exited within ``timeout``, and say so."""
        self.close_stdin()
        try:
            self.proc.wait(timeout)
            return None
        except subprocess.TimeoutExpired:
            self.kill()
            return f"{self.name} did not exit within {timeout:g} s of its stdin closing and was killed"

    async def stop_by_stdin_async(self, timeout: float = 10.0) -> Optional[str]:
        return await asyncio.get_running_loop().run_in_executor(None, self.stop_by_stdin, timeout)

    def stop(self, timeout: float = 10.0) -> Optional[str]:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout`` (a stopped
        process is sent SIGCONT too). Returns a complaint when SIGKILL was needed, else None."""
        if self.proc.poll() is not None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.send_signal(signal.SIGCONT)  # a frozen process handles its SIGTERM
        try:
            self.proc.wait(timeout)
            return None
        except subprocess.TimeoutExpired:
            self.kill()
            return f"{self.name} ignored SIGTERM for {timeout:g} s and was killed"


def start_script(script: Union[str, Path], *args: str, nats_url: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, name: Optional[str] = None,
                 log_dir: Optional[Union[str, Path]] = None, stdin: bool = False) -> Proc:
    """``python SCRIPT ARGS...``: a test or benchmark helper script whose stdout carries
    JSON events, with ``nats_url`` as its NATS_SERVER (``env``: the whole environment
    instead)."""
    script = Path(script)
    return Proc(name or script.stem, [sys.executable, str(script), *args],
                env if env is not None else child_env(nats_url), log_dir=log_dir, stdin=stdin, events=True)


def run_python(*args: str, env: Optional[Dict[str, str]] = None, prefix: Sequence[str] = (),
               timeout: Optional[float] = HANG, capture: bool = True,
               cwd: Optional[Union[str, Path]] = None) -> "subprocess.CompletedProcess[str]":
    """A fresh interpreter run to its end: ``python ARGS...`` (``"-c", code``,
    ``"-m", module`` or a script and its arguments) in ``env`` (default:
    ``child_env()``: the in-tree package first, no NATS_SERVER), under ``prefix``
    (a command that runs it, e.g. in a private network namespace), in ``cwd``. Its
    output is captured as text, or with ``capture=False`` left on this process's (a
    benchmark's run of itself). ``timeout`` (None: none) bounds it."""
    return subprocess.run([*prefix, sys.executable, *args], env=child_env() if env is None else env, cwd=cwd,
                          capture_output=capture, text=True, timeout=timeout)


def dump_logs(procs: Sequence[Proc]) -> str:
    """Each process's header and log, one after the other."""
    return "\n".join(p.dump() for p in procs)


def private_network() -> List[str]:
    """A command prefix running its argument in a network namespace of its own, with its
    loopback up (so the default address 127.0.0.1:4222 is its alone), or [] when the
    machine does not allow one. ``unshare -rn``: a user namespace too, mapping the
    caller to root in it, so an unprivileged user can make one; files it writes are
    still the caller's."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return []
    prefix = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']
    try:
        ok = subprocess.run(prefix + ["true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return prefix if ok else []
