"""End-to-end fault-tolerance harness: a frontend and mock workers as real processes.

Each test gets a fresh stack on its own NATS server. NATS is hosted by a small
``python -c`` process whose ``DistributedRuntime(nats_url="nats://127.0.0.1:0")``
embeds a server on a free port (only the default URL would be embedded by the
frontend or a worker themselves); its URL is passed to the frontend and the
workers as ``NATS_SERVER``, so these tests never touch nats://127.0.0.1:4222.

Synchronisation is on process output (log lines), process events, and bounded
polls of another process's /metrics or /health; the timeouts exist only to turn
a hang into a failure.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest

PY_DIR = Path(__file__).resolve().parents[2]  # .../python, where the dynamo_ctx package lives
MODEL = "ft-mock"
HANG = 60.0  # a wait this long means something hangs

NATS_HOST_CODE = r"""
import sys
from dynamo_ctx import DistributedRuntime
rt = DistributedRuntime(nats_url="nats://127.0.0.1:0")
print(rt.nats_url, flush=True)
sys.stdin.read()  # until the test closes our stdin (or kills us)
rt.shutdown()
"""

CONFIRM_TIMEOUT = 10.0  # the frontend learns of a confirmed abort within milliseconds

# The frontend's stand-in detokenizer (go/frontend/frontend.go: words, detokenize).
_WORDS = "the of and to in is was for on that with as by at from it an be this are which or".split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def expected_tokens(prompt: str, n: int, seed: int = 1000, vocab: int = 32000) -> List[int]:
    """The mock engine's tokens for ``prompt`` as the frontend tokenizes it (one token per UTF-8 byte)."""
    p = len(prompt.encode())
    return [(seed + p + i) % vocab for i in range(n)]


def expected_text(prompt: str, n: int) -> str:
    """The frontend's text for the first ``n`` tokens of ``prompt``'s completion."""
    return "".join(" " + _WORDS[t % len(_WORDS)] for t in expected_tokens(prompt, n))


def parse_prometheus(text: str) -> Dict[str, float]:
    """``{'name{labels}': value}`` for each sample line, the series key exactly as written."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def http_get(url: str, timeout: float = 10.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, dict(r.headers), r.read()


class Proc:
    """A subprocess whose stderr (the logs) is collected line by line by a thread."""

    def __init__(self, name: str, argv: List[str], env: Dict[str, str], stdin: bool = False) -> None:
        # stdin=True: a NATS host, which prints its URL on stdout and lives until stdin closes;
        # otherwise stdout joins stderr in the log.
        self.name = name
        self.argv = argv
        self.lines: List[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stdin else subprocess.STDOUT, text=True, bufsize=1,
        )
        logs = self.proc.stderr if stdin else self.proc.stdout
        self._threads = [threading.Thread(target=self._read, args=(logs,), daemon=True, name=f"{name}-log")]
        for t in self._threads:
            t.start()

    def _read(self, f) -> None:
        for line in f:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_log(self, pattern: str, timeout: float = HANG) -> re.Match:
        """The first log line matching ``pattern`` (waiting for it); fails if the process exits first."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                if self.proc.poll() is not None and not self._threads[0].is_alive():
                    raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before logging {pattern!r}\n{self.log()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: no log line matching {pattern!r} within {timeout} s\n{self.log()}")
                self._cond.wait(min(left, 0.5))

    def log_count(self, pattern: str) -> int:
        rx = re.compile(pattern)
        with self._cond:
            return sum(1 for line in self.lines if rx.search(line))

    def log(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def kill(self) -> None:
        """SIGKILL, and reap."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(HANG)

    def stop(self) -> Optional[str]:
        """SIGTERM then wait; SIGKILL if it does not exit. Returns a complaint, or None."""
        if self.proc.poll() is not None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
            return None
        except subprocess.TimeoutExpired:
            self.kill()
            return f"{self.name} ignored SIGTERM for 10 s and was killed"


class Worker(Proc):
    """``python -m dynamo_ctx.worker --engine mock``, with its metrics port."""

    def __init__(
        self, name: str, env: Dict[str, str], mode: str, model: str, namespace: str, extra: List[str], model_dir: Optional[str] = None
    ) -> None:
        self.mode = mode
        self.model = model  # the name clients use (its metrics' label)
        self.metrics_port = free_port()
        # With a model directory, --model names it and --served-model-name the model.
        names = ["--model", model_dir, "--served-model-name", model] if model_dir else ["--model", model]
        argv = [
            sys.executable, "-m", "dynamo_ctx.worker", "--engine", "mock", "--mode", mode, *names,
            "--namespace", namespace, "--metrics-port", str(self.metrics_port), *extra,
        ]
        super().__init__(name, argv, env)
        self.instance_id: Optional[int] = None

    def ready(self) -> "Worker":
        m = self.wait_log(r"serving \S+ as instance (\d+)")
        self.instance_id = int(m.group(1))
        return self

    def metrics(self) -> Dict[str, float]:
        """This worker's gauges and counters, by bare metric name, summed over their other
        labels (reason, outcome); ``name{label="value"}`` for each such series too. A counter
        with no series yet (no abort of any reason) reads 0."""
        _, _, body = http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        out: Dict[str, float] = collections.defaultdict(float)
        for key, value in parse_prometheus(body.decode()).items():
            name, _, labels = key.partition("{")
            if not name.startswith("dynamo_ctx_worker_"):
                continue  # prometheus_client's default registry: process and Python metrics
            assert labels.startswith(f'model="{self.model}"'), key
            out[name] = out.get(name, 0.0) + value
            rest = labels[len(f'model="{self.model}"'):].strip(",}")
            if rest:
                out[f"{name}{{{rest}}}"] = value
        return out


class Frontend(Proc):
    """``python -m dynamo_ctx.frontend`` on a free port of 127.0.0.1."""

    def __init__(
        self, name: str, env: Dict[str, str], namespace: str, migration_limit: Optional[int], extra: Optional[List[str]] = None
    ) -> None:
        argv = [sys.executable, "-m", "dynamo_ctx.frontend", "--http-host", "127.0.0.1", "--http-port", str(free_port())]
        argv += ["--namespace", namespace]
        if migration_limit is not None:
            argv += ["--migration-limit", str(migration_limit)]
        argv += extra or []
        super().__init__(name, argv, env)
        self.addr = ""

    def ready(self) -> "Frontend":
        m = self.wait_log(r"frontend listening on http://(\S+)")
        self.addr = m.group(1)
        return self

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    @property
    def host_port(self):
        host, port = self.addr.rsplit(":", 1)
        return host, int(port)

    def get_json(self, path: str):
        status, headers, body = http_get(self.url + path)
        return status, headers, json.loads(body)

    def raw_metrics(self) -> Dict[str, float]:
        _, _, body = http_get(self.url + "/metrics")
        return parse_prometheus(body.decode())

    def metrics(self, model: str = MODEL) -> Dict[str, float]:
        """The frontend's counters for ``model`` by short name; absent series count as 0."""
        m = self.raw_metrics()
        lbl = f'{{model="{model}"}}'
        return {
            "requests": m.get("dynamo_ctx_frontend_requests_total" + lbl, 0.0),
            "cancellations": m.get("dynamo_ctx_frontend_cancellations_total" + lbl, 0.0),
            "confirmed": m.get("dynamo_ctx_frontend_aborts_confirmed_total" + lbl, 0.0),
            "latency_count": m.get("dynamo_ctx_frontend_disconnect_to_abort_seconds_count" + lbl, 0.0),
            "latency_sum": m.get("dynamo_ctx_frontend_disconnect_to_abort_seconds_sum" + lbl, 0.0),
        }

    def wait_metrics(
        self, cond: Callable[[Dict[str, float]], bool], what: str, model: str = MODEL, timeout: float = HANG, fail: bool = True
    ) -> Dict[str, float]:
        """Poll /metrics (bounded) until ``cond`` holds for ``model``'s counters.

        On timeout: fail, or with ``fail=False`` return the last reading."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics(model)
            if cond(m):
                return m
            if time.monotonic() > deadline:
                if not fail:
                    return m
                raise AssertionError(f"frontend metrics never satisfied: {what}; last {m}\n{self.log()}")
            time.sleep(0.02)

    def wait_instances(self, n: int, model: str = MODEL, timeout: float = HANG) -> None:
        """Poll /health (bounded) until the frontend knows ``n`` backend instances and lists ``model``."""
        deadline = time.monotonic() + timeout
        while True:
            _, _, h = self.get_json("/health")
            if h.get("instances") == n and model in h.get("models", []):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"frontend never saw {n} instances of {model}: {h}")
            time.sleep(0.02)

    def openai(self, **options):
        import openai

        options.setdefault("max_retries", 0)
        options.setdefault("timeout", HANG)
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", **options)


class Stack:
    """One test's processes: a NATS host, then a frontend and workers joining it.

    Test modules reach the harness only through this object (the ``stack`` fixture).
    """

    model = MODEL
    hang = HANG
    new_id = staticmethod(new_id)
    expected_text = staticmethod(expected_text)
    expected_tokens = staticmethod(expected_tokens)

    def __init__(self) -> None:
        self.namespace = "ft" + uuid.uuid4().hex[:8]
        self.procs: List[Proc] = []
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PY_DIR), os.environ.get("PYTHONPATH")])))
        self.env.pop("NATS_SERVER", None)
        # A SIGTERM drains: a teardown with requests in flight need not wait the 30 s default.
        self.env.setdefault("DYNAMO_CTX_DRAIN_TIMEOUT", "1")
        self.nats_host = Proc("nats-host", [sys.executable, "-c", NATS_HOST_CODE], self.env, stdin=True)
        line = self.nats_host.proc.stdout.readline().strip()
        if not line.startswith("nats://"):
            self.nats_host.kill()
            raise RuntimeError(f"the NATS host printed {line!r}\n{self.nats_host.log()}")
        self.nats_url = line
        self.env["NATS_SERVER"] = self.nats_url
        self.frontend: Optional[Frontend] = None
        self.workers: List[Worker] = []

    def start(
        self, workers: List[dict], frontend: bool = True, migration_limit: Optional[int] = None, frontend_args: Optional[List[str]] = None
    ) -> "Stack":
        """Start all processes at once, then wait until each is ready and the frontend sees the backends.

        ``workers``: dicts with ``mode`` (default agg) and optional ``prefill``/``decode``
        (seconds per token), ``migration_limit``, ``model``, ``model_dir`` (a model directory
        in the Hugging Face layout, served as ``model``), ``args`` (more worker arguments),
        ``env`` (added to the process's environment). May be called again to add workers
        (then ``frontend=False`` or not yet started).
        """
        started = []
        for i, spec in enumerate(workers):
            extra = []
            if "prefill" in spec:
                extra += ["--prefill-time-per-token", str(spec["prefill"])]
            if "decode" in spec:
                extra += ["--decode-time-per-token", str(spec["decode"])]
            if "migration_limit" in spec:
                extra += ["--migration-limit", str(spec["migration_limit"])]
            extra += spec.get("args", [])
            mode = spec.get("mode", "agg")
            env = dict(self.env, **spec.get("env", {}))
            w = Worker(
                f"worker{len(self.workers) + i}-{mode}", env, mode, spec.get("model", MODEL), self.namespace, extra,
                model_dir=spec.get("model_dir"),
            )
            self.procs.append(w)
            started.append(w)
        if frontend:
            self.frontend = Frontend("frontend", self.env, self.namespace, migration_limit, frontend_args)
            self.procs.append(self.frontend)
        for w in started:
            w.ready()
        self.workers += started
        if self.frontend is not None:
            self.frontend.ready()
            backends = [w for w in self.workers if w.mode != "prefill"]
            for model in sorted({w.model for w in backends}):
                self.frontend.wait_instances(len(backends), model)
        return self

    def send_completion(self, body: dict, headers: Optional[Dict[str, str]] = None) -> socket.socket:
        """POST ``body`` to the frontend's /v1/completions over a raw connection (HTTP/1.1,
        ``Connection: close``) and return the socket, its response unread: the test reads it
        (``read_response``), or closes it to play a client that goes away."""
        host, port = self.frontend.host_port
        payload = json.dumps(body).encode()
        head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        s = socket.create_connection((host, port), timeout=self.hang)
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(payload)}\r\n{head}Connection: close\r\n\r\n".encode() + payload)
        return s

    @staticmethod
    def read_response(s: socket.socket) -> bytes:
        """Everything the server sends on ``s`` until it closes; closes ``s``."""
        data = b""
        with s:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return data
                data += chunk

    def worker(self, mode: str) -> Worker:
        (w,) = [w for w in self.workers if w.mode == mode]
        return w

    def close(self) -> List[str]:
        complaints = []
        for p in reversed(self.procs):
            c = p.stop()
            if c:
                complaints.append(c)
        try:
            self.nats_host.proc.stdin.close()
            self.nats_host.proc.wait(10)
        except (subprocess.TimeoutExpired, OSError):
            self.nats_host.kill()
        return complaints

    def logs(self) -> str:
        parts = []
        for p in [self.nats_host, *self.procs]:
            parts.append(f"----- {p.name}: {' '.join(p.argv[1:4])} ... (rc={p.proc.returncode}) -----\n{p.log()}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ checks

    def assert_cancelled(
        self, worker: Worker, request_id: str, worker_before: Dict[str, float], frontend_before: Dict[str, float], label: str = ""
    ) -> Dict[str, float]:
        """The worker's engine confirmed the abort of ``request_id`` and freed everything; the
        frontend counted one cancellation, one confirmed abort and one latency observation."""
        worker.wait_log(rf"Aborted {label}Request ID: {re.escape(request_id)}(?: |$)")
        m = worker.metrics()
        assert m["dynamo_ctx_worker_aborts_confirmed_total"] == worker_before["dynamo_ctx_worker_aborts_confirmed_total"] + 1, m
        assert m["dynamo_ctx_worker_cancellations_received_total"] == worker_before["dynamo_ctx_worker_cancellations_received_total"] + 1, m
        assert m["dynamo_ctx_worker_running_requests"] == 0, m
        assert m["dynamo_ctx_worker_kv_blocks_in_use"] == 0, m
        assert worker.log_count(rf"Aborted {label}Request ID: {re.escape(request_id)}(?: |$)") == 1
        fe = self.frontend
        assert fe is not None
        # The confirmation takes milliseconds; CONFIRM_TIMEOUT only catches a lost one.
        f = fe.wait_metrics(
            lambda x: (
                x["cancellations"] >= frontend_before["cancellations"] + 1
                and x["confirmed"] >= frontend_before["confirmed"] + 1
                and x["latency_count"] >= frontend_before["latency_count"] + 1
            ),
            f"abort of {request_id} confirmed",
            timeout=CONFIRM_TIMEOUT,
            fail=False,
        )
        assert f["cancellations"] == frontend_before["cancellations"] + 1, f
        assert f["confirmed"] == frontend_before["confirmed"] + 1, f
        assert f["latency_count"] == frontend_before["latency_count"] + 1, f
        assert f["latency_sum"] > frontend_before["latency_sum"], f
        return m


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "ft_rep_" + rep.when, rep)


@pytest.fixture
def stack(request):
    """A fresh NATS host for this test; call ``stack.start(...)`` to add a frontend and workers."""
    s = Stack()
    try:
        yield s
    finally:
        complaints = s.close()
        rep = getattr(request.node, "ft_rep_call", None)
        if rep is None or rep.failed:
            print(s.logs())
        if complaints:
            print(s.logs())
            pytest.fail("; ".join(complaints))
