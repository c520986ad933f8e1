"""End-to-end cancellation with a real engine: frontend + vLLM workers, aggregated and
prefill/decode, a client that disconnects in prefill and in decode.

    python python/benchmarks/gpu/vllm_e2e.py --model /tmp/dc-tiny-llama [--engine vllm|mock] [--out result.json]

Starts, as processes on one machine: a NATS host, one frontend, an aggregated worker
(namespace ``gpuagg``) and a prefill + decode pair (namespace ``gpudis``, KV cache handed
over by vLLM's ExampleConnector through files), each worker serving the model directory
(``--model``; make one with make_tiny_llama.py) as ``tiny``. Then, through the frontend's
OpenAI API:

- a completion and a chat completion (the model's own text: its tokenizer and template);
- the same greedy completion through the pair: the same text as the aggregated worker's;
- a client that closes its stream in decode, and one that closes it during a long
  prefill (chunked: --max-num-batched-tokens 64), aggregated and disaggregated: the
  worker that holds the request logs its confirmed abort, and vLLM's own metrics
  (``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``) come back to zero; the
  frontend's disconnect -> abort confirmed time is reported.

``--engine mock`` runs the same against the mock engine (a rehearsal without a GPU; the
engine's gauges are then the worker's own). Prints ``E2E`` lines, a ``E2E SUMMARY {json}``
and ``E2E RESULT: PASS|FAIL``; exits 0 on pass, 1 on a failed check, 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

HERE = Path(__file__).resolve()
PY_DIR = HERE.parents[2]  # .../python
MODEL = "tiny"

NATS_HOST = r"""
import sys
from dynamo_ctx import DistributedRuntime
rt = DistributedRuntime(nats_url="nats://127.0.0.1:0")
print(rt.nats_url, flush=True)
sys.stdin.read()
rt.shutdown()
"""

results: Dict[str, Any] = {"checks": {}, "figures": {}}


def say(*parts: Any) -> None:
    print("E2E", *parts, flush=True)


def check(name: str, ok: bool, detail: Any = "", on_pass: Any = "") -> bool:
    """Record a check; ``detail`` is printed when it fails, ``on_pass`` when it passes."""
    results["checks"][name] = bool(ok)
    say("PASS" if ok else "FAIL", name, on_pass if ok else detail)
    return ok


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A process whose output lines are kept (and copied to a log file)."""

    def __init__(self, name: str, argv: List[str], env: Dict[str, str], log_dir: Path, stdin: bool = False) -> None:
        self.name, self.lines = name, []  # type: str, List[str]
        self.cond = threading.Condition()
        self.log = open(log_dir / f"{name}.log", "w")
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stdin else subprocess.STDOUT, text=True, bufsize=1,
        )
        src = self.proc.stderr if stdin else self.proc.stdout
        threading.Thread(target=self._read, args=(src,), daemon=True).start()

    def _read(self, f: Any) -> None:
        for line in f:
            self.log.write(line)
            self.log.flush()
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def wait_log(self, pattern: str, timeout: float) -> Optional[re.Match]:
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        seen = 0
        with self.cond:
            while True:
                for line in self.lines[seen:]:
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                if self.proc.poll() is not None or time.monotonic() > end:
                    return None
                self.cond.wait(0.2)

    def tail(self, n: int = 30) -> str:
        with self.cond:
            return "".join(self.lines[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def http_json(method: str, url: str, body: Optional[dict] = None, headers: Optional[dict] = None, timeout: float = 120) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def metrics(port: int) -> Dict[str, float]:
    """Samples by name (the labels dropped; summed over label sets)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            name = key.split("{")[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out


def poll(cond: Callable[[], bool], timeout: float, every: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return True
        except Exception:  # noqa: BLE001 - a failed scrape is not a verdict
            pass
        if time.monotonic() > end:
            return False
        time.sleep(every)


class Worker(Proc):
    def __init__(self, name: str, mode: str, namespace: str, args: argparse.Namespace, env: Dict[str, str], log_dir: Path,
                 extra: List[str]) -> None:
        self.port = free_port()
        self.mode = mode
        self.engine = args.engine
        argv = [sys.executable, "-m", "dynamo_ctx.worker", "--engine", args.engine, "--mode", mode, "--namespace", namespace,
                "--model", args.model, "--served-model-name", MODEL, "--metrics-port", str(self.port)]
        if args.engine == "vllm":
            argv += ["--enforce-eager", "--gpu-memory-utilization", str(args.gpu_memory_utilization), "--max-model-len", "2048",
                     "--max-num-seqs", "16", "--max-num-batched-tokens", "64"]
        else:
            argv += ["--decode-time-per-token", "0.002", "--prefill-time-per-token", "0.0005"]
        super().__init__(name, argv + extra, env, log_dir)

    def ready(self, timeout: float) -> bool:
        m = self.wait_log(r"serving \S+ as instance", timeout)
        return m is not None

    def gauges(self) -> Dict[str, float]:
        m = metrics(self.port)
        if self.engine == "vllm":
            return {"running": m.get("vllm:num_requests_running", -1), "waiting": m.get("vllm:num_requests_waiting", -1),
                    "kv_usage": m.get("vllm:kv_cache_usage_perc", -1)}
        return {"running": m.get("dynamo_ctx_worker_running_requests", -1), "waiting": 0.0,
                "kv_usage": m.get("dynamo_ctx_worker_kv_blocks_in_use", -1)}

    def idle(self) -> bool:
        g = self.gauges()
        return g["running"] == 0 and g["waiting"] == 0 and g["kv_usage"] == 0


def stream_and_close(base: str, body: dict, rid: str, close_after_chunks: int, close_after_s: float) -> Dict[str, Any]:
    """Open a streamed completion, read close_after_chunks chunks (or wait close_after_s
    when 0 chunks), then close the connection; returns what was seen."""
    host, port = base.replace("http://", "").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)),
                 {"content-type": "application/json", "x-request-id": rid})
    chunks = 0
    if close_after_chunks == 0:
        time.sleep(close_after_s)
    else:
        resp = conn.getresponse()
        if resp.status != 200:
            return {"status": resp.status, "body": resp.read()[:500].decode("utf-8", "replace")}
        while chunks < close_after_chunks:
            line = resp.fp.readline()
            if not line:
                break
            if line.startswith(b"data: {"):
                chunks += 1
    sock = conn.sock
    closed_at = time.time()
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()
    return {"status": 200, "chunks": chunks, "closed_at": closed_at}


def frontend_latency(port_base: str) -> Dict[str, float]:
    with urllib.request.urlopen(port_base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {"sum": 0.0, "count": 0.0, "cancellations": 0.0, "confirmed": 0.0}
    for line in text.splitlines():
        if line.startswith("dynamo_ctx_frontend_disconnect_to_abort_seconds_sum"):
            out["sum"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("dynamo_ctx_frontend_disconnect_to_abort_seconds_count"):
            out["count"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("dynamo_ctx_frontend_cancellations_total"):
            out["cancellations"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("dynamo_ctx_frontend_aborts_confirmed_total"):
            out["confirmed"] += float(line.rsplit(" ", 1)[1])
    return out


def cancel_case(name: str, base: str, worker: Worker, others: List[Worker], body: dict, label: str, chunks: int, wait: float) -> None:
    """One disconnect: the worker confirms the abort, the engine's gauges come back to zero."""
    rid = f"{name}-{int(time.time() * 1000)}"
    before = frontend_latency(base)
    seen = stream_and_close(base, body, rid, chunks, wait)
    if not check(f"{name}: stream opened", seen.get("status") == 200, seen):
        return
    m = worker.wait_log(rf"Aborted {label}Request ID: {re.escape(rid)}", 30)
    check(f"{name}: abort confirmed by the {worker.mode} worker", m is not None, worker.tail(12))
    after: Dict[str, float] = {}

    def confirmed() -> bool:
        after.update(frontend_latency(base))
        return after["count"] > before["count"]

    if check(f"{name}: frontend counted the confirmation", poll(confirmed, 15), after, after):
        ms = (after["sum"] - before["sum"]) / (after["count"] - before["count"]) * 1000
        results["figures"][f"{name}_disconnect_to_abort_ms"] = round(ms, 3)
        say(f"{name}: disconnect -> abort confirmed {ms:.2f} ms (frontend's histogram)")
    for w in [worker, *others]:
        ok = poll(w.idle, 10)
        g = w.gauges()
        check(f"{name}: {w.name} engine back to zero (running, waiting, KV usage)", ok, g, g)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--engine", choices=["vllm", "mock"], default="vllm")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    ap.add_argument("--out", default="")
    ap.add_argument("--logs", default="")
    ap.add_argument("--start-timeout", type=float, default=240)
    args = ap.parse_args()
    if not os.path.isdir(args.model):
        say("ERROR", f"no model directory at {args.model}")
        return 2
    log_dir = Path(args.logs or tempfile.mkdtemp(prefix="dc-e2e-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(PY_DIR)]))
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.pop("NATS_SERVER", None)
    t0 = time.monotonic()
    procs: List[Proc] = []
    try:
        nats = Proc("nats", [sys.executable, "-c", NATS_HOST], env, log_dir, stdin=True)
        procs.append(nats)
        assert nats.proc.stdout is not None
        url = nats.proc.stdout.readline().strip()
        if not url.startswith("nats://"):
            say("ERROR", "the NATS host printed", url, nats.tail())
            return 2
        env["NATS_SERVER"] = url
        fport = free_port()
        fe = Proc("frontend", [sys.executable, "-m", "dynamo_ctx.frontend", "--http-host", "127.0.0.1", "--http-port", str(fport),
                               "--namespace", "gpuagg"], env, log_dir)
        procs.append(fe)
        fe2port = free_port()
        fe2 = Proc("frontend-disagg", [sys.executable, "-m", "dynamo_ctx.frontend", "--http-host", "127.0.0.1", "--http-port",
                                       str(fe2port), "--namespace", "gpudis"], env, log_dir)
        procs.append(fe2)
        kv_dir = Path(tempfile.mkdtemp(prefix="dc-kv-"))
        kv = lambda role: ["--kv-transfer-config", json.dumps(  # noqa: E731
            {"kv_connector": "ExampleConnector", "kv_role": role, "kv_connector_extra_config": {"shared_storage_path": str(kv_dir)}})]
        specs = [("agg", "agg", "gpuagg", []), ("prefill", "prefill", "gpudis", kv("kv_producer") if args.engine == "vllm" else []),
                 ("decode", "decode", "gpudis", kv("kv_consumer") if args.engine == "vllm" else [])]
        workers: Dict[str, Worker] = {}
        for name, mode, ns, extra in specs:  # one at a time: vLLM profiles the GPU's free memory as it starts
            t = time.monotonic()
            w = Worker(name, mode, ns, args, env, log_dir, extra)
            procs.append(w)
            workers[name] = w
            if not check(f"{name} worker started", w.ready(args.start_timeout), w.tail(60)):
                return 1
            results["figures"][f"{name}_start_s"] = round(time.monotonic() - t, 1)
        base, base2 = f"http://127.0.0.1:{fport}", f"http://127.0.0.1:{fe2port}"
        for b in (base, base2):
            poll(lambda b=b: MODEL in [m["id"] for m in http_json("GET", b + "/v1/models")["data"]], 30)

        # The model's text, aggregated and through the pair (greedy: the same text).
        body = {"model": MODEL, "prompt": "the quick fox jumps over the lazy dog", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        agg = http_json("POST", base + "/v1/completions", body)
        say("aggregated completion:", json.dumps(agg["choices"][0]["text"]), agg["usage"])
        check("aggregated completion: 24 tokens of the model's text",
              agg["usage"]["completion_tokens"] == 24 and agg["choices"][0]["text"].strip() != "", agg)
        chat = http_json("POST", base + "/v1/chat/completions",
                         {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8, "ignore_eos": True})
        check("chat completion", chat["usage"]["completion_tokens"] == 8, chat, chat["usage"])
        dis = http_json("POST", base2 + "/v1/completions", body)
        say("disaggregated completion:", json.dumps(dis["choices"][0]["text"]), dis["usage"])
        check("disaggregated completion: 24 tokens", dis["usage"]["completion_tokens"] == 24, dis)
        # Greedy on random weights: near-equal logits may flip between two engines' numerics,
        # so the same text is reported, not required.
        same = dis["choices"][0]["text"] == agg["choices"][0]["text"]
        results["figures"]["disagg_text_equals_agg"] = same
        say("disaggregated text equals the aggregated worker's:", same)
        if args.engine == "vllm":
            dm = metrics(workers["decode"].port)
            results["figures"]["decode_external_prefix_cache_hits"] = dm.get("vllm:external_prefix_cache_hits_total", -1)
            say("decode worker external prefix cache hits (KV from the prefill worker):", dm.get("vllm:external_prefix_cache_hits_total"))

        long_prompt = " ".join(["the quick fox jumps over the lazy dog"] * 220)  # ~1,980 tokens: 31 chunks of 64
        long_body = {"model": MODEL, "prompt": long_prompt, "max_tokens": 64, "ignore_eos": True}
        decode_body = {"model": MODEL, "prompt": "the quick fox", "max_tokens": 1800, "ignore_eos": True}
        a, p, d = workers["agg"], workers["prefill"], workers["decode"]
        cancel_case("agg_decode", base, a, [], decode_body, "", 5, 0)
        cancel_case("agg_prefill", base, a, [], long_body, "", 0, 0.03)
        cancel_case("disagg_decode", base2, d, [p], decode_body, "", 5, 0)
        cancel_case("disagg_prefill", base2, p, [d], long_body, "Prefill ", 0, 0.03)
        for w in workers.values():
            check(f"{w.name} worker alive", w.proc.poll() is None, w.tail(20))
        return 0 if all(results["checks"].values()) else 1
    except Exception as e:  # noqa: BLE001 - reported, then the logs
        check("ran without an exception", False, repr(e))
        for p_ in procs:
            say(f"--- {p_.name} ---\n{p_.tail(30)}")
        return 1
    finally:
        results["figures"]["total_s"] = round(time.monotonic() - t0, 1)
        for p_ in reversed(procs):
            if isinstance(p_, Proc) and p_.name == "nats":
                try:
                    assert p_.proc.stdin is not None
                    p_.proc.stdin.close()
                except OSError:
                    pass
            p_.stop()
        results["pass"] = bool(results["checks"]) and all(results["checks"].values())
        say("SUMMARY", json.dumps(results))
        say("RESULT:", "PASS" if results["pass"] else "FAIL")
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
