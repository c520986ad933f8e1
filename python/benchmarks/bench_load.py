"""End to end and under load, through the frontend, against the performance targets of
docs/design.md.

    python python/benchmarks/bench_load.py [--streams 1000] [--cancel 200] [--only e2e|load]

End to end: 64 streams of 200 tokens at once (``--e2e-streams``,
``--e2e-tokens``) on one mock worker stepping every 1 ms (``--step``; a prompt token costs
1/100 of it):
tokens/s, time between tokens (p50 against the step), time to the first
token, CPU per token of the frontend and of the worker.

Under load:
Runs the stack as processes (python/tests/harness: frontend, mock
workers, NATS host), opens ``--streams`` streaming completions at once on raw
sockets and keeps them all reading. Once every stream has its first token,
``--cancel`` of them are closed one at a time at random moments; each close
is timed against the worker's log line confirming the engine abort (both
are this machine's wall clock). Two set-ups:

- aggregated: two agg workers, cancelled in decode;
- disaggregated: a prefill and a decode worker; the cancelled requests are
  sent with a long prompt while the others stream, and closed while their
  remote prefill runs (the prefill worker's abort is what is timed).

With ``--trace`` the stack's processes record the library's kill trace and
each set-up also prints where the disconnects' time went, hop by hop
(client close, frontend kill, Kill frame written and read, the worker's
context killed, the engine abort logged).

Printed per set-up: disconnect -> engine abort confirmed p50/p99/max
(docs/design.md, Performance targets: p99 <= 5 ms), tokens/s delivered to the
clients, the frontend's CPU per 1k tokens/s (cores) and its RSS per in-flight
request (KiB).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import AsyncIterator, Dict, List, NamedTuple, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the harness
from harness import Proc, Stack, free_port, http_get, wait_until  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")

#: What runs the clients' event loop: uvloop when installed (a dependency of
#: the package, as for its commands), so that the clients take less of the
#: CPUs they share with the stacks they measure; asyncio's with
#: BENCH_CLIENT_LOOP=asyncio.
CLIENT_LOOP = os.environ.get("BENCH_CLIENT_LOOP", "auto")


def run_clients(main):  # type: ignore[no-untyped-def]
    from dynamo_ctx.cli._runner import loop_runner

    return loop_runner(CLIENT_LOOP)(main)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pct(xs: List[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


#: Bytes of a stream's end kept: enough for an error event's text.
TAIL = 400


def count_new(tail: bytes, chunk: bytes, pattern: bytes) -> int:
    """Occurrences of ``pattern`` that end inside ``chunk``, counting those that
    began in ``tail`` (the bytes before it): none is counted twice, none missed."""
    return (tail[-(len(pattern) - 1) :] + chunk).count(pattern)


class Dechunk:
    """The body of an HTTP/1.1 response, from the bytes read: headers dropped,
    chunked transfer coding undone (the frontend streams with it), so that no
    chunk header sits inside an event."""

    def __init__(self) -> None:
        self.buf = b""
        self.headers = True
        self.chunked = False
        self.left = 0  # bytes of the current chunk still to come

    def feed(self, data: bytes) -> bytes:
        if not self.headers and self.chunked and not self.buf and not self.left:
            out = self._whole(data)
            if out is not None:
                return out
        self.buf += data
        out = b""
        if self.headers:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return out
            self.chunked = b"transfer-encoding: chunked" in self.buf[:end].lower()
            self.buf, self.headers = self.buf[end + 4 :], False
        if not self.chunked:
            out, self.buf = self.buf, b""
            return out
        while self.buf:
            if self.left:
                take = self.buf[: self.left]
                out += take
                self.left -= len(take)
                self.buf = self.buf[len(take) :]
                continue
            line_end = self.buf.find(b"\r\n", 2 if self.buf.startswith(b"\r\n") else 0)
            if line_end < 0:
                break
            line = self.buf[:line_end].strip()  # the CRLF ending the previous chunk, then the size
            self.buf = self.buf[line_end + 2 :]
            self.left = int(line.split(b";")[0], 16) if line else 0
        return out

    @staticmethod
    def _whole(data: bytes) -> Optional[bytes]:
        """The payload of ``data`` when it is whole chunks (the usual read:
        one event per chunk, each written and flushed alone), else None."""
        parts = []
        i, n = 0, len(data)
        while i < n:
            j = data.find(b"\r\n", i)
            if j < 0:
                return None
            try:
                size = int(data[i:j], 16)
            except ValueError:
                return None
            end = j + 2 + size
            if end + 2 > n or data[end : end + 2] != b"\r\n":
                return None
            parts.append(data[j + 2 : end])
            i = end + 2
        return parts[0] if len(parts) == 1 else b"".join(parts)


class Client:
    """One streaming completion on a raw socket: counts tokens (SSE events) until
    the end or until it is closed, and records when it closed.

    It reads with a bare protocol (no stream reader, no task woken per read):
    the client shares the machine's CPUs with the stack it measures, so what
    it spends per token is taken from the frontend and the worker."""

    def __init__(self, rid: str, prompt: str, max_tokens: int) -> None:
        self.rid, self.prompt, self.max_tokens = rid, prompt, max_tokens
        self.tokens = 0
        self.stamps: List[float] = []  # arrival time of each token's event (monotonic)
        self.sent_at = 0.0
        loop = asyncio.get_running_loop()
        self.first = loop.create_future()
        self.closed_at: Optional[float] = None
        self.done = False
        self.end = ""  # why the stream ended without [DONE]
        self.last = b""  # its last bytes
        self.transport: Optional[asyncio.Transport] = None
        self._body = Dechunk()
        self._finished = loop.create_future()

    async def run(self, host: str, port: int, model: str) -> None:
        body = json.dumps({"model": model, "prompt": self.prompt, "max_tokens": self.max_tokens, "stream": True}).encode()
        loop = asyncio.get_running_loop()
        try:
            self.transport, _ = await loop.create_connection(lambda: _ClientProtocol(self), host, port)
            self.sent_at = time.monotonic()
            self.transport.write(
                b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                + f"x-request-id: {self.rid}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
            )
            await self._finished
        except (ConnectionError, OSError) as e:
            self.end = f"{type(e).__name__}: {e}"
        finally:
            if not self.first.done():
                self.first.set_result(None)
            if self.closed_at is None and self.transport is not None:
                self.transport.close()

    def _feed(self, raw: bytes) -> None:
        chunk = self._body.feed(raw)
        if not chunk:
            return
        before = self.last
        self.last = (before + chunk)[-TAIL:]
        n = count_new(before, chunk, b"data: {")
        if n:
            if not self.first.done():
                self.first.set_result(None)
            self.tokens += n
            now = time.monotonic()
            if n == 1:
                self.stamps.append(now)
            else:
                self.stamps.extend([now] * n)
        if count_new(before, chunk, b"data: [DONE]"):
            self.done = True
            self._finish("")

    def _finish(self, why: str) -> None:
        if not self._finished.done():
            if not self.done:
                self.end = why
            self._finished.set_result(None)

    def close(self) -> None:
        """Hang up now (the disconnect that is timed)."""
        if self.transport is not None and self.closed_at is None:
            self.closed_at = time.time()
            # The FIN leaves now: transport.abort() alone closes the socket
            # on the loop's next turn, which 1,000 busy streams delay.
            # (uvloop's transports hide their socket behind one that cannot
            # shut down: the shutdown goes through a duplicate of its fd.)
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                try:
                    with socket.socket(fileno=os.dup(sock.fileno())) as dup:
                        dup.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.transport.abort()


class _ClientProtocol(asyncio.Protocol):
    """Hands a Client the bytes it reads, and tells it when the connection ends."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        if not self.client._finished.done():
            self.client._feed(data)

    def eof_received(self) -> bool:
        self.client._finish("closed by the server")
        return False

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.client._finish(f"{type(exc).__name__}: {exc}" if exc else "closed by the server")


def aborted_at(lines: List[str], label: str) -> Dict[str, float]:
    """rid -> the worker log's time of "Aborted <label>Request ID: rid"."""
    rx = re.compile(r"\[(\d+\.\d+)\].*Aborted " + label + r"Request ID: (\S+)")
    out = {}
    for line in lines:
        m = rx.search(line)
        if m:
            out[m.group(2)] = float(m.group(1))
    return out


async def load(stack: Stack, n: int, cancel: int, max_tokens: int, disagg: bool, seed: int) -> Tuple[List[float], dict]:
    rng = random.Random(seed)
    fe = stack.frontend
    host, port = fe.host_port
    pid = fe.proc.pid
    idle_rss = rss_kib(pid)
    streams = [Client(f"load-{seed}-{i}", f"load {i}", max_tokens) for i in range(n)]
    tasks = [asyncio.ensure_future(c.run(host, port, stack.model)) for c in streams]
    await asyncio.wait_for(asyncio.gather(*[c.first for c in streams]), 120)
    # Steady state: every stream is producing.
    loaded_rss = rss_kib(pid)
    t0, cpu0, tok0 = time.monotonic(), cpu_seconds(pid), sum(c.tokens for c in streams)
    victims: List[Client] = []
    if disagg:
        # Long prompts, closed while their remote prefill runs.
        for i in range(cancel):
            v = Client(f"load-{seed}-prefill-{i}", "p" * 400, max_tokens)
            victims.append(v)
            t = asyncio.ensure_future(v.run(host, port, stack.model))
            tasks.append(t)
            await asyncio.sleep(rng.uniform(0.05, 0.15))  # inside the prefill (400 x 1 ms)
            v.close()
            await asyncio.sleep(rng.uniform(0.0, 0.02))
    else:
        for v in rng.sample(streams, cancel):
            await asyncio.sleep(rng.uniform(0.0, 0.02))
            v.close()
            victims.append(v)
    t1, cpu1, tok1 = time.monotonic(), cpu_seconds(pid), sum(c.tokens for c in streams)
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 300)
    worker = stack.worker("prefill") if disagg else None
    logs: List[str] = []
    for w in [worker] if worker else stack.workers:
        logs += w.lines
    aborts = aborted_at(logs, "Prefill " if disagg else "")
    lat = [(aborts[v.rid] - v.closed_at) * 1000 for v in victims if v.rid in aborts and v.closed_at]
    done = sum(c.done for c in streams if c not in victims)
    lost = [c for c in streams if c not in victims and not c.done]
    tok_s = (tok1 - tok0) / (t1 - t0)
    cores = (cpu1 - cpu0) / (t1 - t0)
    figures = {
        "confirmed": len(lat),
        "victims": len(victims),
        "completed": done,
        "expected_complete": n - (0 if disagg else cancel),
        "tokens_per_s": tok_s,
        "frontend_cores": cores,
        "cores_per_1k_tok_s": cores / (tok_s / 1000) if tok_s else float("nan"),
        "rss_per_request_kib": (loaded_rss - idle_rss) / n,
        "idle_rss_mib": idle_rss / 1024,
        "loaded_rss_mib": loaded_rss / 1024,
        # For the hop breakdown (--trace): each victim's close and its worker's abort.
        "closes": {v.rid: v.closed_at for v in victims if v.closed_at},
        "aborts": aborts,
        "lost": lost,
    }
    return lat, figures


#: The hops of a disconnect, in order (the library's kill trace marks the middle ones).
HOPS = [
    ("closed", "client: socket shut down"),
    ("frontend.client_gone", "frontend: the client seen gone (the hang-up watcher or net/http)"),
    ("caller.kill_hook", "frontend: the request's context killed"),
    ("caller.frame_written", "frontend: Kill frame written"),
    ("worker.frame_read", "worker: Kill frame read"),
    ("worker.ctx_killed", "worker: handler's context killed, its fd signalled"),
    ("aborted", "worker: engine abort logged (Python)"),
]


def print_breakdown(trace_path: str, closes: Dict[str, float], aborts: Dict[str, float], disagg: bool,
                    last: str = "") -> None:
    """Per hop of the timed disconnects: p50/p90/p99 of the time since the
    previous hop. Disaggregated, the worker hops are the decode worker's (the
    first a kill reaches) and the last includes its kill of the prefill.
    ``last`` names the last hop (``aborts``' times) where it is not the
    worker's logged abort."""
    marks: Dict[str, Dict[str, float]] = {}
    try:
        with open(trace_path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    # The earliest of each hop: each process appends its
                    # marks every 50 ms, so the file is not in time order,
                    # and disaggregated both workers mark the same id.
                    hops = marks.setdefault(parts[2], {})
                    t = int(parts[0]) / 1e9
                    hops[parts[1]] = min(t, hops.get(parts[1], t))
    except FileNotFoundError:
        print("  (no kill trace written)")
        return
    rows = []
    for rid, t in closes.items():
        m = dict(marks.get(rid, {}), closed=t)
        if rid in aborts:
            m["aborted"] = aborts[rid]
        if all(h in m for h, _ in HOPS):
            rows.append(m)
    if not rows:
        print("  (no disconnect has every hop in the trace)")
        return
    print(f"  per hop, ms since the previous one ({len(rows)} disconnects): p50 / p90 / p99")
    for (a, _), (b, what) in zip(HOPS, HOPS[1:]):
        d = [(r[b] - r[a]) * 1000 for r in rows]
        if disagg and b == "aborted":
            what = "prefill worker: engine abort logged (after the decode worker's kill of it)"
        elif last and b == "aborted":
            what = last
        print(f"    {b:22s} {pct(d, 50):7.2f} {pct(d, 90):7.2f} {pct(d, 99):7.2f}   {what}")


def run(name: str, workers: List[dict], args, disagg: bool) -> bool:
    trace = None
    if args.trace:
        from dynamo_ctx._lib import native

        env_name = native().KILL_TRACE_ENV
        trace = f"{tempfile.gettempdir()}/bench-load-trace-{os.getpid()}-{int(disagg)}.txt"
        os.environ[env_name] = trace  # the stack's processes inherit it
    stack = Stack()
    stack.env["DYN_LOG"] = "info"  # the workers' default level, as deployed (the harness's logs each request)
    try:
        stack.start(workers)
        lat, f = run_clients(load(stack, args.streams, args.cancel, args.max_tokens, disagg, args.seed))
    finally:
        stack.close()
    if f["lost"]:
        # A stream that did not complete is a lost request: show what it got
        # and what the stack logged about it.
        print(f"{name}: {len(f['lost'])} streams did not complete:")
        for c in f["lost"][:5]:
            print(f"  {c.rid}: {c.tokens} tokens, {c.end or 'no end'}; its last bytes: {c.last[-200:]!r}")
            for p in [stack.frontend, *stack.workers]:
                for line in p.lines:
                    if c.rid in line:
                        print(f"    {p.name}: {line.rstrip()[:300]}")
        if trace:
            del os.environ[env_name]
    ok = bool(lat) and pct(lat, 99) <= 5.0 and not f["lost"]
    print(f"{name}: {args.streams} streams, {f['victims']} disconnected")
    if not f["tokens_per_s"]:
        # Seen in runs back to back, before the frontend's per-model clients
        # shared its view of the instances (every first request got 404).
        print("  WARNING: no token reached the clients: this run measured nothing")
    if lat:
        print(
            f"  disconnect -> engine abort confirmed: p50 {pct(lat, 50):.2f} ms, p99 {pct(lat, 99):.2f} ms, "
            f"max {max(lat):.2f} ms (n={len(lat)} of {f['victims']}); target p99 <= 5 ms: {'meets' if ok else 'misses'}"
        )
    else:
        print("  no abort was confirmed in the workers' logs")
    if trace:
        print_breakdown(trace, f["closes"], f["aborts"], disagg)
        try:
            os.unlink(trace)
        except OSError:
            pass
    print(
        f"  {f['tokens_per_s']:,.0f} tokens/s to the clients while disconnecting; frontend {f['frontend_cores']:.2f} cores "
        f"= {f['cores_per_1k_tok_s']:.3f} cores per 1k tokens/s"
    )
    print(
        f"  frontend RSS {f['idle_rss_mib']:.0f} MiB idle -> {f['loaded_rss_mib']:.0f} MiB with {args.streams} in flight "
        f"= {f['rss_per_request_kib']:.1f} KiB per in-flight request; streams completed {f['completed']}/{f['expected_complete']}"
    )
    return ok


async def end_to_end(stack: Stack, n: int, max_tokens: int) -> dict:
    """n streams of max_tokens at once through this project's stack."""
    pids = {"frontend": stack.frontend.proc.pid, "worker": stack.workers[0].proc.pid}
    return await end_to_end_at(stack.frontend.host_port, stack.model, pids, n, max_tokens)


async def end_to_end_at(addr, model: str, pids: Dict[str, int], n: int, max_tokens: int) -> dict:
    """n streams of max_tokens at once, all read to the end: throughput, time
    between tokens and to the first, CPU per token of the frontend and worker."""
    host, port = addr
    cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
    client0 = time.process_time()
    t0 = time.monotonic()
    streams = [Client(f"e2e-{i}-{os.getpid()}-{time.monotonic_ns()}", f"e2e {i}", max_tokens) for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*[c.run(host, port, model) for c in streams]), 300)
    took = time.monotonic() - t0
    cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
    client_cpu = time.process_time() - client0
    tokens = sum(c.tokens for c in streams)
    # Time between tokens as benchmarking tools define it per request (inter-token
    # latency): (last token - first token) / (tokens - 1); tokens that arrive
    # in one read share a timestamp, so per-token gaps would say little.
    tbt = [(c.stamps[-1] - c.stamps[0]) * 1000 / (len(c.stamps) - 1) for c in streams if len(c.stamps) > 1]
    ttft = [(c.stamps[0] - c.sent_at) * 1000 for c in streams if c.stamps]
    return {
        "tokens": tokens, "complete": sum(c.done for c in streams), "tokens_per_s": tokens / took,
        "tbt_p50": pct(tbt, 50), "tbt_p99": pct(tbt, 99), "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
        "frontend_us_per_token": cpu["frontend"] / tokens * 1e6, "worker_us_per_token": cpu["worker"] / tokens * 1e6,
        "client_us_per_token": client_cpu / tokens * 1e6,
    }


def e2e_line(name: str, f: dict, args) -> str:
    step = f"{f['tbt_p50'] / (args.step * 1000):.2f}x the step" if args.step else "no mock delay"
    return (
        f"  {name}: {f['tokens_per_s']:,.0f} tokens/s ({f['complete']}/{args.e2e_streams} complete); time between tokens "
        f"p50 {f['tbt_p50']:.2f} ms ({step}), p99 {f['tbt_p99']:.2f} ms; "
        f"TTFT p50 {f['ttft_p50']:.1f} ms, p99 {f['ttft_p99']:.1f} ms; CPU per token: frontend "
        f"{f['frontend_us_per_token']:.1f} us, worker {f['worker_us_per_token']:.1f} us, client (this process) "
        f"{f['client_us_per_token']:.1f} us"
    )


def both(f: dict) -> float:
    """Frontend + worker CPU per token (us)."""
    return f["frontend_us_per_token"] + f["worker_us_per_token"]


def run_e2e(args) -> None:
    print(f"end to end: {args.e2e_streams} streams x {args.e2e_tokens} tokens, mock step {args.step * 1000:g} ms, same client")
    stack = Stack()
    stack.env["DYN_LOG"] = "info"  # the worker's default level, as deployed
    try:
        # A step of args.step whatever the batch (the mock's default adds a
        # cost per sequence, calibrated on the CPU engine: 5.7 ms at 64),
        # as Dynamo's mocker steps at about 1 ms here.
        stack.start([{"decode": args.step, "prefill": args.step / 100, "args": ["--decode-time-per-seq", "0"]}])
        run_clients(end_to_end(stack, 8, 20))  # warm-up
        f = run_clients(end_to_end(stack, args.e2e_streams, args.e2e_tokens))
    finally:
        stack.close()
    print(e2e_line("dynamo_ctx frontend + mock worker", f, args))
    py = dynamo_python()
    if py is None:
        print("  Dynamo's frontend + mocker: skipped (ai-dynamo is not importable here; set DYNAMO_PYTHON to a Python that has it:"
              " pip install ai-dynamo==1.6.1 --no-deps plus its dependencies but aisimulate)")
        return
    d = run_clients(dynamo_end_to_end(py, args.e2e_streams, args.e2e_tokens, args.dynamo_speedup_ratio))
    if d is None:
        print("  Dynamo's frontend + mocker: did not start")
        return
    print(e2e_line(f"Dynamo 1.6.1 frontend + mocker (--speedup-ratio {args.dynamo_speedup_ratio:g})", d, args))
    print(
        f"  ratio dynamo_ctx/Dynamo: tokens/s {f['tokens_per_s'] / d['tokens_per_s']:.2f}, time between tokens "
        f"{f['tbt_p50'] / d['tbt_p50']:.2f}, frontend CPU per token {f['frontend_us_per_token'] / d['frontend_us_per_token']:.2f}, "
        f"frontend + worker CPU per token {both(f) / both(d):.2f}"
    )


# ---------------------------------------------------------------- Dynamo's frontend + mocker, same client

MODEL_DIR_CODE = r"""
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
d = sys.argv[1]
words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(2000)] + ["e2e"]
tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.decoder = decoders.WordPiece(prefix="##")
tok.save(d + "/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
           "model_max_length": 4096, "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"},
          open(d + "/tokenizer_config.json", "w"))
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": len(words),
           "max_position_embeddings": 4096, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "num_key_value_heads": 4, "intermediate_size": 128, "eos_token_id": 2, "bos_token_id": 1},
          open(d + "/config.json", "w"))
json.dump({"eos_token_id": 2, "bos_token_id": 1}, open(d + "/generation_config.json", "w"))
"""


def dynamo_python() -> Optional[str]:
    """A Python that runs Dynamo's frontend and mocker (``ai-dynamo``): $DYNAMO_PYTHON, else this one."""
    import subprocess

    py = os.environ.get("DYNAMO_PYTHON", sys.executable)
    ok = subprocess.run([py, "-c", "import dynamo.frontend, dynamo.mocker, tokenizers"], capture_output=True).returncode == 0
    return py if ok else None


class DynamoStack(NamedTuple):
    """Dynamo's frontend + mocker, started: the frontend's address, the two pids, and
    the mocker's process (its log holds its "request cancellation received" lines)."""

    addr: Tuple[str, int]
    pids: Dict[str, int]
    mocker: Proc


@contextlib.asynccontextmanager
async def dynamo_frontend(py: str, speedup: float) -> AsyncIterator[Optional[DynamoStack]]:
    """``python -m dynamo.frontend`` + ``python -m dynamo.mocker`` serving model "e2e" (file
    discovery, TCP request plane, a generated word-level tokenizer), or None if they did
    not start."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        model, kv = os.path.join(tmp, "model"), os.path.join(tmp, "kv")
        os.makedirs(model)
        subprocess.run([py, "-c", MODEL_DIR_CODE, model], check=True)
        port = free_port()
        env = dict(os.environ, DYN_FILE_KV=kv)
        env.pop("DYN_SYSTEM_PORT", None)
        common = ["--discovery-backend", "file", "--request-plane", "tcp"]
        procs = [
            Proc("dynamo-mocker", [py, "-m", "dynamo.mocker", "--model-path", model, "--model-name", "e2e",
                                   "--speedup-ratio", str(speedup)] + common, env),
            Proc("dynamo-frontend", [py, "-m", "dynamo.frontend", "--http-port", str(port)] + common, env),
        ]
        try:
            started = True
            try:
                wait_until(lambda: b'"e2e"' in http_get(f"http://127.0.0.1:{port}/v1/models", timeout=2)[2]
                           or any(not p.running() for p in procs), "Dynamo's frontend to list the model", timeout=120,
                           every=0.5)
                started = all(p.running() for p in procs)
            except AssertionError:
                started = False
            yield DynamoStack(("127.0.0.1", port), {"frontend": procs[1].pid, "worker": procs[0].pid}, procs[0]) if started else None
        finally:
            for p in procs:
                p.stop()


async def dynamo_end_to_end(py: str, n: int, max_tokens: int, speedup: float) -> Optional[dict]:
    """The end-to-end run against Dynamo's frontend + mocker (dynamo_frontend)."""
    async with dynamo_frontend(py, speedup) as started:
        if started is None:
            return None
        addr, pids, _ = started
        await end_to_end_at(addr, "e2e", pids, 8, 20)  # warm-up
        return await end_to_end_at(addr, "e2e", pids, n, max_tokens)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--cancel", type=int, default=200, help="streams disconnected (timed) per set-up")
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--decode", type=float, default=0.1, help="mock seconds per token")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--e2e-streams", type=int, default=64)
    ap.add_argument("--e2e-tokens", type=int, default=200)
    ap.add_argument("--step", type=float, default=0.001, help="mock step (s) of the end-to-end run")
    ap.add_argument("--only", choices=["e2e", "load"], help="run one part")
    ap.add_argument("--trace", action="store_true", help="print where each timed disconnect's time went, hop by hop")
    ap.add_argument("--dynamo-speedup-ratio", type=float, default=6.0,
                    help="Dynamo mocker's --speedup-ratio (6: ~1 ms per decode step on the project's machine)")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # children inherit it
    if hard < 4 * args.streams:
        # A client socket and the frontend's per stream, and the worker's.
        args.streams = max(50, hard // 4)
        args.cancel = min(args.cancel, args.streams // 5)
        print(f"NOFILE's hard limit is {hard}: running {args.streams} streams instead")
    if args.only != "load":
        run_e2e(args)
    if args.only == "e2e":
        return 0
    print(f"load: seed {args.seed}, {args.max_tokens} tokens per stream at {args.decode} s per token, {os.cpu_count()} CPUs")
    run("aggregated, cancelled in decode", [{"decode": args.decode}] * 2, args, disagg=False)
    run(
        "disaggregated, cancelled in prefill",
        [{"mode": "prefill", "prefill": 0.001}, {"mode": "decode", "decode": args.decode}],
        args,
        disagg=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
