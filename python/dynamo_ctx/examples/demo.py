"""The end-to-end demo: ``python -m dynamo_ctx.demo`` (``make demo``).

Starts the embedded stack on this machine (NATS inside the first process, on a
free port of 127.0.0.1 unless ``NATS_SERVER`` names one; an OpenAI-compatible
frontend, a prefill and a decode mock worker, all in a namespace of their own,
so two demos run side by side), sends requests
through the OpenAI API, cancels some of them at different phases the way real
clients do (timeouts, closing a stream), and prints for each request the phase
it was cancelled in, the time from the client's disconnect to the worker's
confirmed abort (as the frontend measured it) and the KV-cache blocks the abort
freed. Exits 0 when every cancellation was confirmed and every worker is back
to zero running requests and zero KV blocks in use.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List

from ..cli import _args, _errors

MODEL = "mock-llm"
HANG = 60.0  # seconds: the starter's bound on a hang (the harness's HANG, which the package cannot import)

# free_port, http_get, Proc and wait_until below are a small starter of the demo's
# own: the tests' and benchmarks' process harness (python/tests/harness) is test
# code that the wheel does not ship, so the package cannot import it.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def scrape(port: int) -> Dict[str, float]:
    """Prometheus text -> {metric name (without labels): value}, summing label sets."""
    out: Dict[str, float] = {}
    for line in http_get(port, "/metrics").splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            if "_bucket" in name:
                continue
            key = name.split("{")[0]
            out[key] = out.get(key, 0.0) + float(value)
    return out


class Proc:
    """A child process whose stderr lines are kept (and matched) as they arrive."""

    def __init__(self, name: str, args: List[str], env: Dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", *args], env=env, stderr=subprocess.PIPE, text=True)
        self.lines: List[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_log(self, pattern: str, timeout: float = HANG) -> str:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        with self.cond:
            seen = 0
            while True:
                for line in self.lines[seen:]:
                    if rx.search(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    tail = "".join(self.lines[-20:])
                    raise RuntimeError(f"{self.name}: no log line matching {pattern!r}\n{tail}")
                self.cond.wait(left)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_until(cond, what: str, timeout: float = HANG) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Demo:
    """The stack's processes (a prefill and a decode worker, the frontend) in a namespace
    of their own, and the table of the cancellations measured through them."""

    def __init__(self, nats_url: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env["NATS_SERVER"] = nats_url
        self.run = uuid.uuid4().hex[:8]
        self.namespace = f"demo-{self.run}"
        self.http_port, self.prefill_port, self.decode_port = free_port(), free_port(), free_port()
        common = ["--model", MODEL, "--namespace", self.namespace]
        self.procs = [
            Proc("prefill", ["dynamo_ctx.worker", "--mode", "prefill", *common, "--metrics-port", str(self.prefill_port),
                             "--prefill-time-per-token", "0.002"], env),
            Proc("decode", ["dynamo_ctx.worker", "--mode", "decode", *common, "--metrics-port", str(self.decode_port),
                            "--decode-time-per-token", "0.01"], env),
            Proc("frontend", ["dynamo_ctx.frontend", "--http-port", str(self.http_port), "--http-host", "127.0.0.1",
                              "--namespace", self.namespace], env),
        ]
        self.prefill, self.decode, self.frontend = self.procs
        self.base = f"http://127.0.0.1:{self.http_port}/v1"
        self.rows: List[tuple] = []
        self.ok = True

    def ready(self) -> None:
        self.prefill.wait_log(r"serving \S+ as instance")
        self.decode.wait_log(r"serving \S+ as instance")
        self.frontend.wait_log(r"frontend listening")
        wait_until(lambda: MODEL in http_get(self.http_port, "/v1/models"), "the model to be listed")

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()

    def scrape_all(self) -> Dict[str, Dict[str, float]]:
        return {"fe": scrape(self.http_port), "p": scrape(self.prefill_port), "d": scrape(self.decode_port)}

    def cancelled(self, rid: str, phase_expected: str, send: Callable[[str], None]) -> None:
        """Send ``rid`` as ``send`` does (a client that goes away), wait for the worker's
        confirmed abort and the frontend's count of it, and add the request's row."""
        m0 = self.scrape_all()
        t0 = time.perf_counter()
        send(rid)
        # The worker that held the request logs the abort; the frontend
        # records disconnect -> confirmation.
        who = self.prefill if phase_expected == "prefill" else self.decode
        label = "Prefill " if phase_expected == "prefill" else ""
        who.wait_log(rf"Aborted {label}Request ID: {re.escape(rid)}")
        wait_until(lambda: scrape(self.http_port).get("dynamo_ctx_frontend_aborts_confirmed_total", 0)
                   > m0["fe"].get("dynamo_ctx_frontend_aborts_confirmed_total", 0), "the frontend to count the confirmation")
        m1 = self.scrape_all()
        key = "dynamo_ctx_frontend_disconnect_to_abort_seconds_sum"
        latency = m1["fe"][key] - m0["fe"].get(key, 0.0)
        freed = sum(
            m1[k].get("dynamo_ctx_worker_abort_freed_kv_blocks_total", 0)
            - m0[k].get("dynamo_ctx_worker_abort_freed_kv_blocks_total", 0)
            for k in ("p", "d")
        )
        clean = all(
            m1[k]["dynamo_ctx_worker_running_requests"] == 0 and m1[k]["dynamo_ctx_worker_kv_blocks_in_use"] == 0 for k in ("p", "d")
        )
        self.ok = self.ok and clean
        self.rows.append(
            (
                rid,
                phase_expected,
                f"{latency * 1000:.2f} ms",
                f"{int(freed)} KV blocks",
                "yes" if clean else "NO",
                f"{(time.perf_counter() - t0):.2f} s",
            )
        )

    def requests(self) -> None:
        """One request that completes, then three cancelled at different phases."""
        from openai import APITimeoutError, OpenAI

        base, run = self.base, self.run
        client = OpenAI(base_url=base, api_key="unused", max_retries=0)

        # 1. A request that completes.
        t0 = time.perf_counter()
        r = client.completions.create(
            model=MODEL, prompt="Hello, world", max_tokens=20, extra_headers={"x-request-id": f"demo-complete-{run}"}
        )
        print(f"demo-complete: {r.usage.completion_tokens if r.usage else 0} tokens in {time.perf_counter() - t0:.2f} s, not cancelled\n")

        # 2. Client timeout during prefill: a 3000-token prompt takes ~6 s to prefill.
        def timeout_in_prefill(rid: str) -> None:
            c = OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=0.5)
            try:
                c.completions.create(model=MODEL, prompt="x" * 3000, max_tokens=50, extra_headers={"x-request-id": rid})
            except APITimeoutError:
                pass

        self.cancelled(f"demo-prefill-timeout-{run}", "prefill", timeout_in_prefill)

        # 3. Client timeout during decode (non-streaming chat, 1000 tokens at 10 ms each).
        def timeout_in_decode(rid: str) -> None:
            c = OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=1.0)
            try:
                c.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Tell me a story"}],
                    max_tokens=1000,
                    extra_headers={"x-request-id": rid},
                )
            except APITimeoutError:
                pass

        self.cancelled(f"demo-decode-timeout-{run}", "decode", timeout_in_decode)

        # 4. A streaming chat the client closes after 5 chunks.
        def close_stream(rid: str) -> None:
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Count"}],
                max_tokens=1000,
                stream=True,
                extra_headers={"x-request-id": rid},
            )
            for i, _ in enumerate(stream):
                if i == 4:
                    break
            stream.close()

        self.cancelled(f"demo-stream-closed-{run}", "decode", close_stream)

    def table(self) -> bool:
        """Print the rows; whether every cancellation was confirmed and freed everything."""
        header = ("request id", "phase cancelled", "disconnect -> abort", "freed", "workers at zero", "wall time")
        widths = [max(len(str(x)) for x in col) for col in zip(header, *self.rows)]
        line = "  ".join("{:<%d}" % w for w in widths)
        print(line.format(*header))
        print(line.format(*("-" * w for w in widths)))
        for row in self.rows:
            print(line.format(*row))
        print()
        good = self.ok and len(self.rows) == 3
        print("every cancellation confirmed, every resource freed" if good else "SOMETHING LEAKED")
        return good


def main() -> int:
    from dynamo_ctx import DistributedRuntime

    # This process hosts NATS on a free port (or joins NATS_SERVER's); the
    # workers and the frontend started below get the address it really uses.
    given = os.environ.get("NATS_SERVER")
    try:
        runtime = DistributedRuntime(nats_url=given or "nats://127.0.0.1:0")
    except RuntimeError as e:
        if getattr(e, "code_name", "") == "ECONNECT":
            raise _errors.connect_error(e, given, None) from None
        raise
    print(f"NATS at {runtime.nats_url} ({'NATS_SERVER' if given else 'embedded here'})")
    demo = Demo(runtime.nats_url)
    try:
        demo.ready()
        print(f"frontend on http://127.0.0.1:{demo.http_port}, namespace {demo.namespace}, model {MODEL!r}: "
              "prefill worker + decode worker\n")
        demo.requests()
    finally:
        demo.stop()
        runtime.shutdown()
    return 0 if demo.table() else 1


def _run() -> int:
    """main(), with the failures a user can act on as one line on stderr."""
    prog = "python -m dynamo_ctx.demo"
    if not _args.engine_available("openai"):
        _errors.fail(prog, "the demo drives the stack through the openai client, which is not installed; "
                  "install dynamo-ctx[demo] (or openai)", 1)
    try:
        return main()
    except _errors.CommandError as e:
        _errors.fail(prog, str(e), e.status)


if __name__ == "__main__":
    raise SystemExit(_run())
