"""NATS for tests and benchmarks: the NATS host, and real nats-server processes.

``NatsHost`` is the usual one: a small ``python -c`` process whose
``DistributedRuntime(nats_url="nats://127.0.0.1:0")`` embeds a NATS server on
a free port and prints its URL; the frontend and workers get that URL as
NATS_SERVER (only the default URL would be embedded by them), so nothing
touches nats://127.0.0.1:4222.

``NatsServer`` and ``NatsCluster`` are real nats-server processes: one server
or a cluster on loopback. The binary is built once from the nats-server module already in go.mod (the
same version the library embeds) into ``build/nats-server`` at the repository
root; nothing is installed. Every server listens on ephemeral loopback ports
picked here, so suites and demos run side by side.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from .procs import ROOT, Proc, free_port

NATS_HOST_CODE = r"""
import sys
from dynamo_ctx import DistributedRuntime
rt = DistributedRuntime(nats_url="nats://127.0.0.1:0")
print(rt.nats_url, flush=True)
sys.stdin.read()  # until the test closes our stdin (or kills us)
rt.shutdown()
"""


class NatsHost(Proc):
    """The NATS host: an embedded NATS server on a free port of 127.0.0.1, in a process
    of its own (``url``) that lives until ``stop()`` closes its stdin."""

    def __init__(self, env: Dict[str, str], name: str = "nats-host", log_dir: Optional[Union[str, Path]] = None) -> None:
        super().__init__(name, [sys.executable, "-c", NATS_HOST_CODE], env, log_dir=log_dir, stdin=True, events=True)
        line = self.read_line().strip()
        if not line.startswith("nats://"):
            self.kill()
            raise self.error(f"printed {line!r}, not a NATS URL")
        self.url = line

    def stop(self, timeout: float = 10.0) -> Optional[str]:
        """Close its stdin (it shuts its runtime down and exits); SIGKILL if it lingers."""
        return self.stop_by_stdin(timeout)


_BIN = ROOT / "build" / "nats-server"
_MODULE = "github.com/nats-io/nats-server/v2"


def _go() -> str:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        raise RuntimeError("go is needed to build nats-server for this test")
    return go


def nats_server_binary() -> Path:
    """The path of a nats-server binary built from go.mod's module (built on first use)."""
    if _BIN.exists() and _BIN.stat().st_mtime >= (ROOT / "go.mod").stat().st_mtime:
        return _BIN
    _BIN.parent.mkdir(parents=True, exist_ok=True)
    tmp = _BIN.with_name(f".nats-server.{os.getpid()}")
    subprocess.run([_go(), "build", "-o", str(tmp), _MODULE], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    os.replace(tmp, _BIN)
    return _BIN


def _wait_listening(port: int, proc: Proc, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.running():
            raise proc.error(f"exited before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise proc.error(f"did not listen on {port} within {timeout} s")


class NatsServer:
    """One nats-server process; ``extra`` are further command-line arguments.

    ``config`` is the text of a configuration file (for auth and TLS blocks);
    ``url`` is what clients use (``nats://`` or ``tls://`` as ``scheme`` says).
    """

    def __init__(self, extra: Sequence[str] = (), config: Optional[str] = None,
                 scheme: str = "nats", name: str = "n", cluster_port: Optional[int] = None,
                 routes: Sequence[int] = (), cluster_name: str = "dc-test",
                 port: Optional[int] = None, log_dir: Optional[Union[str, Path]] = None,
                 jetstream: bool = False) -> None:
        self.port = port or free_port()
        self.cluster_port = cluster_port
        self.name = name
        self.scheme = scheme
        self._dir = tempfile.mkdtemp(prefix="dc-nats-")
        args: List[str] = [str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(self.port),
                           "-n", name]
        if config is not None:
            conf = Path(self._dir) / "server.conf"
            conf.write_text(config)
            args += ["-c", str(conf)]
        if cluster_port is not None:
            args += ["--cluster_name", cluster_name, "--cluster", f"nats://127.0.0.1:{cluster_port}"]
            if routes:
                args += ["--routes", ",".join(f"nats://127.0.0.1:{p}" for p in routes)]
        if jetstream:
            # Discovery's stream lives in memory; the server wants a store directory all the same.
            args += ["-js", "-sd", str(Path(self._dir) / "js")]
        self.monitor_port = free_port()
        args += ["-m", str(self.monitor_port)] + list(extra)
        self.args = args
        self.log_dir = log_dir
        self.proc: Optional[Proc] = None

    def routes(self) -> int:
        """How many other nodes this node has routes to (0 when its monitor does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/routez", timeout=2) as r:
                routes = json.load(r).get("routes") or []
                return len({rt.get("remote_id") for rt in routes})
        except (OSError, ValueError):
            return 0

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> "NatsServer":
        self.proc = Proc(f"nats-server-{self.name}", self.args, log_dir=self.log_dir, new_session=True)
        _wait_listening(self.port, self.proc)
        return self

    def kill(self) -> None:
        """SIGKILL (the node dies)."""
        if self.proc is not None:
            self.proc.kill()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


class NatsCluster:
    """``n`` nats-server processes routed into one cluster on loopback, with JetStream unless
    ``jetstream`` is false (then discovery announces by heartbeat to every watcher)."""

    def __init__(self, n: int = 3, extra: Sequence[str] = (), log_dir: Optional[Union[str, Path]] = None,
                 jetstream: bool = True) -> None:
        cports = [free_port() for _ in range(n)]
        self.nodes = [NatsServer(extra=extra, name=f"node{i}", cluster_port=cports[i],
                                 routes=[p for j, p in enumerate(cports) if j != i], log_dir=log_dir,
                                 jetstream=jetstream)
                      for i in range(n)]

    def start(self, timeout: float = 20.0) -> "NatsCluster":
        for node in self.nodes:
            node.start()
        self._wait_routed(timeout)
        return self

    def _wait_routed(self, timeout: float) -> None:
        """Until every node reports routes to all the others (its /routez)."""
        deadline = time.monotonic() + timeout
        want = len(self.nodes) - 1
        for node in self.nodes:
            while node.routes() < want:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{node.name} has {node.routes()} of {want} routes")
                time.sleep(0.05)

    def urls(self) -> List[str]:
        return [n.url for n in self.nodes]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class Subscription:
    """A plain NATS subscription to one subject, in NATS's text protocol (no client
    library): what a test reads of the bus itself, e.g. a worker's load reports on
    ``dc.load.<path>``. ``next(timeout)`` is the next message's payload. The server's
    token is the URL's (``nats://token@host:port``), else NATS_TOKEN's: a test that
    subscribes runs its NATS host with NATS_TOKEN set (the embedded server's own
    token is in a file of the library's)."""

    def __init__(self, url: str, subject: str, timeout: float = 10.0) -> None:
        userinfo, _, address = url.split("://", 1)[-1].rpartition("@")
        host, _, port = address.rpartition(":")
        connect = {"verbose": False, "pedantic": False}
        token = userinfo or os.environ.get("NATS_TOKEN")
        if token:
            connect["auth_token"] = token
        self.sock = socket.create_connection((host, int(port)), timeout)
        self.buf = b""
        self._line(timeout)  # the server's INFO
        self.sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nSUB " + subject.encode() + b" 1\r\nPING\r\n")
        while self._line(timeout) != b"PONG":  # subscribed once the server answers
            pass

    def _line(self, timeout: float) -> bytes:
        self.sock.settimeout(timeout)
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the NATS server closed the connection")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def next(self, timeout: float = 10.0) -> bytes:
        """The next message's payload (socket.timeout when none comes in time)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self._line(max(deadline - time.monotonic(), 0.001))
            if line == b"PING":
                self.sock.sendall(b"PONG\r\n")
            elif line.startswith(b"MSG "):
                size = int(line.split()[-1])
                while len(self.buf) < size + 2:
                    self.buf += self.sock.recv(65536)
                payload, self.buf = self.buf[:size], self.buf[size + 2:]
                return payload
            elif line.startswith(b"-ERR"):
                raise ConnectionError(line.decode())

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
