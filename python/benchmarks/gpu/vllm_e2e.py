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
import json
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "tests"))  # the harness (this script runs from a checkout)
from harness import (  # noqa: E402
    NatsHost, Proc, ProcError, SSEStream, child_env, http_get, http_json, metric_sums, scrape, send_post, wait_until,
)
from harness import Frontend as _Frontend  # noqa: E402
from harness import Worker as _Worker  # noqa: E402

MODEL = "tiny"

results: Dict[str, Any] = {"checks": {}, "figures": {}}


def say(*parts: Any) -> None:
    print("E2E", *parts, flush=True)


def check(name: str, ok: bool, detail: Any = "", on_pass: Any = "") -> bool:
    """Record a check; ``detail`` is printed when it fails, ``on_pass`` when it passes."""
    results["checks"][name] = bool(ok)
    say("PASS" if ok else "FAIL", name, on_pass if ok else detail)
    return ok


def poll(cond: Callable[[], bool], what: str, timeout: float) -> bool:
    """Whether ``cond()`` came true within ``timeout`` (a failed scrape is not a verdict)."""
    return bool(wait_until(cond, what, timeout, 0.05, ignore=(Exception,), fail=False))


def logged(proc: Proc, pattern: str, timeout: float) -> bool:
    """Whether ``proc`` logged a line matching ``pattern`` within ``timeout``."""
    try:
        proc.wait_log(pattern, timeout)
        return True
    except ProcError:
        return False


class Worker(_Worker):
    """The worker command serving ``--model`` as MODEL with the engine ``--engine`` names."""

    def __init__(self, name: str, mode: str, namespace: str, args: argparse.Namespace, env: Dict[str, str], log_dir: Path,
                 extra: List[str]) -> None:
        self.engine = args.engine
        if args.engine == "vllm":
            flags = ["--enforce-eager", "--gpu-memory-utilization", str(args.gpu_memory_utilization), "--max-model-len", "2048",
                     "--max-num-seqs", "16", "--max-num-batched-tokens", "64"]
        else:
            flags = ["--decode-time-per-token", "0.002", "--prefill-time-per-token", "0.0005"]
        super().__init__(name, env, namespace=namespace, mode=mode, model=MODEL, model_dir=args.model, engine=args.engine,
                         args=flags + extra, log_dir=log_dir)
        self.port = self.metrics_port

    def gauges(self) -> Dict[str, float]:
        m = scrape(self.port)
        if self.engine == "vllm":
            return {"running": m.get("vllm:num_requests_running", -1), "waiting": m.get("vllm:num_requests_waiting", -1),
                    "kv_usage": m.get("vllm:kv_cache_usage_perc", -1)}
        return {"running": m.get("dynamo_ctx_worker_running_requests", -1), "waiting": 0.0,
                "kv_usage": m.get("dynamo_ctx_worker_kv_blocks_in_use", -1)}

    def idle(self) -> bool:
        g = self.gauges()
        return g["running"] == 0 and g["waiting"] == 0 and g["kv_usage"] == 0


def stream_and_close(fe: _Frontend, body: dict, rid: str, close_after_chunks: int, close_after_s: float) -> Dict[str, Any]:
    """Open a streamed completion, read close_after_chunks chunks (or wait close_after_s
    when 0 chunks), then close the connection; returns what was seen."""
    host, port = fe.host_port
    sock = send_post(host, port, "/v1/completions", dict(body, stream=True), {"x-request-id": rid}, close=False, timeout=60)
    chunks = 0
    if close_after_chunks == 0:
        time.sleep(close_after_s)
    else:
        stream = SSEStream(sock)
        if stream.status != 200:
            rest = stream.f.read()[:500].decode("utf-8", "replace")
            stream.close()
            return {"status": stream.status, "body": rest}
        for data in stream.data():
            chunks += data.startswith("{")
            if chunks >= close_after_chunks:
                break
    closed_at = time.time()
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    return {"status": 200, "chunks": chunks, "closed_at": closed_at}


def frontend_latency(fe: _Frontend) -> Dict[str, float]:
    m = metric_sums(http_get(fe.url + "/metrics")[2].decode())
    return {"sum": m["dynamo_ctx_frontend_disconnect_to_abort_seconds_sum"],
            "count": m["dynamo_ctx_frontend_disconnect_to_abort_seconds_count"],
            "cancellations": m["dynamo_ctx_frontend_cancellations_total"],
            "confirmed": m["dynamo_ctx_frontend_aborts_confirmed_total"]}


def cancel_case(name: str, fe: _Frontend, worker: Worker, others: List[Worker], body: dict, label: str, chunks: int,
                wait: float) -> None:
    """One disconnect: the worker confirms the abort, the engine's gauges come back to zero."""
    rid = f"{name}-{int(time.time() * 1000)}"
    before = frontend_latency(fe)
    seen = stream_and_close(fe, body, rid, chunks, wait)
    if not check(f"{name}: stream opened", seen.get("status") == 200, seen):
        return
    ok = logged(worker, rf"Aborted {label}Request ID: {re.escape(rid)}", 30)
    check(f"{name}: abort confirmed by the {worker.mode} worker", ok, worker.tail(12))
    after: Dict[str, float] = {}

    def confirmed() -> bool:
        after.update(frontend_latency(fe))
        return after["count"] > before["count"]

    if check(f"{name}: frontend counted the confirmation", poll(confirmed, "the confirmation", 15), after, after):
        ms = (after["sum"] - before["sum"]) / (after["count"] - before["count"]) * 1000
        results["figures"][f"{name}_disconnect_to_abort_ms"] = round(ms, 3)
        say(f"{name}: disconnect -> abort confirmed {ms:.2f} ms (frontend's histogram)")
    for w in [worker, *others]:
        ok = poll(w.idle, f"{w.name} idle", 10)
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
    env = child_env()
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    t0 = time.monotonic()
    procs: List[Proc] = []
    try:
        try:
            nats = NatsHost(env, name="nats", log_dir=log_dir)
        except ProcError as e:
            say("ERROR", "the NATS host did not start:", e)
            return 2
        procs.append(nats)
        env["NATS_SERVER"] = nats.url
        fe = _Frontend("frontend", env, namespace="gpuagg", log_dir=log_dir)
        procs.append(fe)
        fe2 = _Frontend("frontend-disagg", env, namespace="gpudis", log_dir=log_dir)
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
            if not check(f"{name} worker started", logged(w, w.READY, args.start_timeout), w.tail(60)):
                return 1
            results["figures"][f"{name}_start_s"] = round(time.monotonic() - t, 1)
        base, base2 = fe.url, fe2.url
        for b in (base, base2):
            poll(lambda b=b: MODEL in [m["id"] for m in http_json("GET", b + "/v1/models")["data"]], f"{MODEL} at {b}", 30)

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
            dm = scrape(workers["decode"].port)
            results["figures"]["decode_external_prefix_cache_hits"] = dm.get("vllm:external_prefix_cache_hits_total", -1)
            say("decode worker external prefix cache hits (KV from the prefill worker):", dm.get("vllm:external_prefix_cache_hits_total"))

        long_prompt = " ".join(["the quick fox jumps over the lazy dog"] * 220)  # ~1,980 tokens: 31 chunks of 64
        long_body = {"model": MODEL, "prompt": long_prompt, "max_tokens": 64, "ignore_eos": True}
        decode_body = {"model": MODEL, "prompt": "the quick fox", "max_tokens": 1800, "ignore_eos": True}
        a, p, d = workers["agg"], workers["prefill"], workers["decode"]
        cancel_case("agg_decode", fe, a, [], decode_body, "", 5, 0)
        cancel_case("agg_prefill", fe, a, [], long_body, "", 0, 0.03)
        cancel_case("disagg_decode", fe2, d, [p], decode_body, "", 5, 0)
        cancel_case("disagg_prefill", fe2, p, [d], long_body, "Prefill ", 0, 0.03)
        for w in workers.values():
            check(f"{w.name} worker alive", w.running(), w.tail(20))
        return 0 if all(results["checks"].values()) else 1
    except Exception as e:  # noqa: BLE001 - reported, then the logs
        check("ran without an exception", False, repr(e))
        for p_ in procs:
            say(f"--- {p_.name} ---\n{p_.tail(30)}")
        return 1
    finally:
        results["figures"]["total_s"] = round(time.monotonic() - t0, 1)
        for p_ in reversed(procs):
            p_.stop(20)
        results["pass"] = bool(results["checks"]) and all(results["checks"].values())
        say("SUMMARY", json.dumps(results))
        say("RESULT:", "PASS" if results["pass"] else "FAIL")
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
