"""The commands as processes: mock workers, frontends, and a stack of them on one NATS host.

``Worker`` is ``python -m dynamo_ctx.worker`` and ``Frontend`` is ``python -m
dynamo_ctx.frontend``, each on free ports of 127.0.0.1. ``Stack`` is one test's
processes: a NATS host of its own, then a frontend and workers joining it, all in
a namespace of their own, so that suites and benchmarks run side by side.

Synchronisation is on process output (log lines), process events, and bounded
polls of another process's /metrics or /health; the timeouts exist only to turn
a hang into a failure.
"""

from __future__ import annotations

import collections
import json
import re
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .http_client import http_get, http_request, parse_prometheus, send_post
from .nats import NatsHost
from .procs import HANG, Proc, child_env, free_port
from .sse import SSEStream

MODEL = "ft-mock"
CONFIRM_TIMEOUT = 10.0  # the frontend learns of a confirmed abort within milliseconds

# The frontend's stand-in text (go/frontend/text.go: words, standInDecoder), restated: the
# tests' expected text must not come from the frontend under test (a response would give
# the words, but a frontend that got them wrong would then pass), and expected_text is
# needed where no frontend runs yet.
_WORDS = "the of and to in is was for on that with as by at from it an be this are which or".split()


def new_id(prefix: str) -> str:
    """A request id no other test or run uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def new_namespace(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:8]


def expected_tokens(prompt: Union[str, Sequence[int]], n: int, seed: int = 1000, vocab: int = 32000) -> List[int]:
    """The mock engine's first ``n`` tokens for ``prompt``: a text as the frontend
    tokenizes it (one token per UTF-8 byte), or the token ids sent to a worker."""
    p = len(prompt.encode()) if isinstance(prompt, str) else len(prompt)
    return [(seed + p + i) % vocab for i in range(n)]


def expected_text(prompt: str, n: int) -> str:
    """The frontend's text for the first ``n`` tokens of ``prompt``'s completion."""
    return "".join(" " + _WORDS[t % len(_WORDS)] for t in expected_tokens(prompt, n))


LogDir = Optional[Union[str, Path]]


#: The log level a test's worker runs at: INFO, and each request's "New
#: Request ID" line, which the handlers log at DEBUG (tests wait for it).
REQUEST_LOG = "info,dynamo_ctx.backends.vllm=debug"


class Worker(Proc):
    """``python -m dynamo_ctx.worker`` serving ``model`` in ``namespace``, with its metrics port.

    ``model_dir``: a model directory in the Hugging Face layout, given as ``--model``
    and served as ``model`` (``--served-model-name``). ``engine``, ``mode`` or ``model``
    None: that option is left to the command's default. ``command``: what runs
    instead of ``python -m dynamo_ctx.worker`` (a wrapper taking the same arguments).
    """

    def __init__(self, name: str, env: Dict[str, str], *, namespace: str, mode: Optional[str] = "agg",
                 model: Optional[str] = MODEL, model_dir: Optional[str] = None, engine: Optional[str] = "mock",
                 args: Sequence[str] = (), metrics_port: Optional[int] = None,
                 command: Optional[Sequence[str]] = None, log_dir: LogDir = None) -> None:
        self.mode = mode or "agg"
        self.model = model  # the name clients use (its metrics' label)
        self.namespace = namespace
        self.metrics_port = metrics_port or free_port()
        argv = list(command or [sys.executable, "-m", "dynamo_ctx.worker"])
        if engine is not None:
            argv += ["--engine", engine]
        if mode is not None:
            argv += ["--mode", mode]
        if model_dir is not None:
            argv += ["--model", model_dir, "--served-model-name", str(model)]
        elif model is not None:
            argv += ["--model", model]
        argv += ["--namespace", namespace, "--metrics-port", str(self.metrics_port), *args]
        if "--log-level" not in args and "DYN_LOG" not in env:
            env = dict(env, DYN_LOG=REQUEST_LOG)
        super().__init__(name, argv, env, log_dir=log_dir)
        self.instance_id: Optional[int] = None

    READY = r"serving \S+ as instance (\d+)"

    def ready(self, timeout: float = HANG) -> "Worker":
        """Once it serves (its log says so): ``instance_id`` is its instance."""
        self.instance_id = int(self.wait_log(self.READY, timeout).group(1))
        return self

    async def ready_async(self, timeout: float = HANG) -> "Worker":
        self.instance_id = int((await self.wait_log_async(self.READY, timeout)).group(1))
        return self

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def metrics(self) -> Dict[str, float]:
        """This worker's gauges and counters, by bare metric name, summed over their other
        labels (reason, outcome); ``name{label="value"}`` for each such series too. A counter
        with no series yet (no abort of any reason) reads 0."""
        _, _, body = http_get(self.metrics_url + "/metrics")
        out: Dict[str, float] = collections.defaultdict(float)
        label = f'model="{self.model}"'
        for key, value in parse_prometheus(body.decode()).items():
            name, _, labels = key.partition("{")
            if not name.startswith("dynamo_ctx_worker_"):
                continue  # prometheus_client's default registry: process and Python metrics
            assert labels.startswith(label), key
            out[name] = out.get(name, 0.0) + value
            rest = labels[len(label):].strip(",}")
            if rest:
                out[f"{name}{{{rest}}}"] = value
        return out


class Frontend(Proc):
    """``python -m dynamo_ctx.frontend`` on a free port of 127.0.0.1, serving ``namespace``."""

    def __init__(self, name: str, env: Dict[str, str], *, namespace: str, migration_limit: Optional[int] = None,
                 args: Sequence[str] = (), port: Optional[int] = None, log_dir: LogDir = None) -> None:
        self.port = port or free_port()
        argv = [sys.executable, "-m", "dynamo_ctx.frontend", "--http-host", "127.0.0.1", "--http-port", str(self.port),
                "--namespace", namespace]
        if migration_limit is not None:
            argv += ["--migration-limit", str(migration_limit)]
        argv += list(args)
        super().__init__(name, argv, env, log_dir=log_dir)
        self.namespace = namespace
        self.addr = f"127.0.0.1:{self.port}"

    def ready(self, timeout: float = HANG) -> "Frontend":
        """Once it listens (its log says so)."""
        self.addr = self.wait_log(r"frontend listening on http://(\S+)", timeout).group(1)
        return self

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    @property
    def host_port(self) -> Tuple[str, int]:
        host, port = self.addr.rsplit(":", 1)
        return host, int(port)

    def request(self, method: str, path: str, body: Optional[Any] = None,
                headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, str], bytes]:
        """One request to ``path`` (``body`` JSON unless bytes); an error status is
        returned, not raised."""
        return http_request(method, self.url + path, body, headers)

    def request_json(self, method: str, path: str, body: Optional[Any] = None,
                     headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, str], Any]:
        """``request``, its body parsed as JSON (an error's body too)."""
        status, hdrs, raw = self.request(method, path, body, headers)
        return status, hdrs, json.loads(raw)

    def get_json(self, path: str) -> Tuple[int, Dict[str, str], Any]:
        return self.request_json("GET", path)

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
                raise self.error(f"frontend metrics never satisfied: {what}; last {m}")
            time.sleep(0.02)

    def wait_instances(self, n: int, model: str = MODEL, timeout: float = HANG) -> None:
        """Poll /health (bounded) until the frontend knows ``n`` backend instances and lists
        ``model``; a frontend not listening yet counts as not there yet."""
        deadline = time.monotonic() + timeout
        h: Any = None
        while True:
            try:
                _, _, h = self.get_json("/health")
                if h.get("instances") == n and model in h.get("models", []):
                    return
            except OSError:
                if not self.running():
                    raise self.error("exited") from None
            if time.monotonic() > deadline:
                raise self.error(f"frontend never saw {n} instances of {model}: {h}")
            time.sleep(0.02)

    def openai(self, **options: Any) -> Any:
        import openai

        options.setdefault("max_retries", 0)
        options.setdefault("timeout", HANG)
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", **options)


class Stack:
    """One test's processes: a NATS host, then a frontend and workers joining it.

    ``log_dir``: where their log files go (a test's tmp_path); ``prefix``: of the
    namespace, which is the stack's own. Fault-tolerance test modules reach the harness
    only through this object (the ``stack`` fixture).
    """

    model = MODEL
    hang = HANG
    new_id = staticmethod(new_id)
    expected_text = staticmethod(expected_text)
    expected_tokens = staticmethod(expected_tokens)

    def __init__(self, log_dir: LogDir = None, prefix: str = "ft") -> None:
        self.namespace = new_namespace(prefix)
        self.log_dir = log_dir
        self.procs: List[Proc] = []
        self.env = child_env()
        # A SIGTERM drains: a teardown with requests in flight need not wait the 30 s default.
        self.env.setdefault("DYNAMO_CTX_DRAIN_TIMEOUT", "1")
        self.nats_host = NatsHost(self.env, log_dir=log_dir)
        self.nats_url = self.nats_host.url
        self.env["NATS_SERVER"] = self.nats_url
        self.frontend: Optional[Frontend] = None
        self.workers: List[Worker] = []

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def worker_from(self, spec: Dict[str, Any], index: int) -> Worker:
        """A worker started as ``spec`` says (see ``start``)."""
        extra: List[str] = []
        if "prefill" in spec:
            extra += ["--prefill-time-per-token", str(spec["prefill"])]
        if "decode" in spec:
            extra += ["--decode-time-per-token", str(spec["decode"])]
        if "migration_limit" in spec:
            extra += ["--migration-limit", str(spec["migration_limit"])]
        extra += spec.get("args", [])
        mode = spec.get("mode", "agg")
        return Worker(
            spec.get("name", f"worker{index}-{mode}"), dict(self.env, **spec.get("env", {})), namespace=self.namespace,
            mode=mode, model=spec.get("model", MODEL), model_dir=spec.get("model_dir"), args=extra,
            command=spec.get("command"), log_dir=self.log_dir,
        )

    def start(
        self, workers: List[dict], frontend: bool = True, migration_limit: Optional[int] = None,
        frontend_args: Optional[List[str]] = None, frontend_log: bool = True,
    ) -> "Stack":
        """Start all processes at once, then wait until each is ready and the frontend sees the backends.

        ``workers``: dicts with ``mode`` (default agg) and optional ``prefill``/``decode``
        (seconds per token), ``migration_limit``, ``model``, ``model_dir`` (a model directory
        in the Hugging Face layout, served as ``model``), ``args`` (more worker arguments),
        ``env`` (added to the process's environment), ``name``, ``command`` (what runs
        instead of ``python -m dynamo_ctx.worker``). May be called again to add workers
        (then ``frontend=False`` or not yet started). ``frontend_log=False``: the frontend
        logs too little to say it listens (``--log-level WARNING``): its /health says so.
        """
        started = []
        for i, spec in enumerate(workers):
            w = self.worker_from(spec, len(self.workers) + i)
            self.procs.append(w)
            started.append(w)
        if frontend:
            self.frontend = Frontend("frontend", self.env, namespace=self.namespace, migration_limit=migration_limit,
                                     args=frontend_args or [], log_dir=self.log_dir)
            self.procs.append(self.frontend)
        for w in started:
            w.ready()
        self.workers += started
        if self.frontend is not None:
            if frontend_log:
                self.frontend.ready()
            backends = [w for w in self.workers if w.mode != "prefill"]
            for model in sorted({str(w.model) for w in backends}):
                self.frontend.wait_instances(len(backends), model)
        return self

    def send_completion(self, body: dict, headers: Optional[Dict[str, str]] = None) -> socket.socket:
        """POST ``body`` to the frontend's /v1/completions over a raw connection (HTTP/1.1,
        ``Connection: close``) and return the socket, its response unread: the test reads it
        (``read_all``), or closes it to play a client that goes away."""
        assert self.frontend is not None
        host, port = self.frontend.host_port
        return send_post(host, port, "/v1/completions", body, headers, timeout=self.hang)

    def open_stream(self, body: dict, headers: Optional[Dict[str, str]] = None) -> SSEStream:
        """``send_completion`` of ``body`` streamed, its response read event by event."""
        return SSEStream(self.send_completion(dict(body, stream=True), headers))

    def worker(self, mode: str) -> Worker:
        (w,) = [w for w in self.workers if w.mode == mode]
        return w

    def close(self) -> List[str]:
        """Stop every process (SIGTERM, then SIGKILL), the NATS host last; the complaints
        of those that needed SIGKILL."""
        complaints = []
        for p in reversed(self.procs):
            c = p.stop()
            if c:
                complaints.append(c)
        self.nats_host.stop()
        return complaints

    # ------------------------------------------------------------------ checks

    def assert_cancelled(
        self, worker: Worker, request_id: str, worker_before: Dict[str, float], frontend_before: Dict[str, float], label: str = ""
    ) -> Dict[str, float]:
        """The worker's engine confirmed the abort of ``request_id`` and freed everything; the
        frontend counted one cancellation, one confirmed abort and one latency observation."""
        aborted = rf"Aborted {label}Request ID: {re.escape(request_id)}(?: |$)"
        worker.wait_log(aborted)
        m = worker.metrics()
        assert m["dynamo_ctx_worker_aborts_confirmed_total"] == worker_before["dynamo_ctx_worker_aborts_confirmed_total"] + 1, m
        assert m["dynamo_ctx_worker_cancellations_received_total"] == worker_before["dynamo_ctx_worker_cancellations_received_total"] + 1, m
        assert m["dynamo_ctx_worker_running_requests"] == 0, m
        assert m["dynamo_ctx_worker_kv_blocks_in_use"] == 0, m
        assert worker.log_count(aborted) == 1
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
