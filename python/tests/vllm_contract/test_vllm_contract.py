"""The contract with vLLM: the handlers, the mock engine and the worker against vLLM itself, without a GPU.

``make test-vllm`` runs this module in a side virtualenv per vLLM version
(python/tests/vllm_contract/versions.txt, built by make_env.sh) with
``VLLM_TARGET_DEVICE=cpu``. Where vLLM is not installed (the dev venv, CI) it
is skipped before anything heavy is imported.

- Every ``generate``/``abort`` call the handlers make (aggregated, prefill,
  decode with an in-process prefill worker, completed and cancelled) binds to
  ``AsyncLLM``'s real signatures; every ``SamplingParams`` they ask for builds
  vLLM's; the KV transfer parameters are vLLM's protocol (``do_remote_decode``
  at prefill, the prefill engine's own ``RequestOutput.kv_transfer_params`` at
  decode, which runs the original prompt).
- The attributes the handlers and the worker read exist on vLLM's classes.
- The mock engine's public surface is a compatible subset of vLLM's.
- The worker parses vLLM's engine arguments with vLLM's parser into
  ``AsyncEngineArgs``, and its ``--help`` lists them.
- ``EngineDeadError`` is where the worker looks for it.

vLLM 0.26 ignores ``VLLM_TARGET_DEVICE=cpu`` at run time (it picks its CPU
platform only on a CPU build of vLLM or macOS) and cannot build its argument
parser on a machine without a GPU ("Failed to infer device type"); with that
variable set, this module then installs vLLM's CPU platform itself (in this
process, and in the worker processes it starts), as newer vLLM does.
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here: `make test-vllm` runs these tests in side environments that have it",
        allow_module_level=True,
    )

import ast  # noqa: E402
import asyncio  # noqa: E402
import dataclasses  # noqa: E402
import enum  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

import vllm  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm import SamplingParams as VllmSamplingParams  # noqa: E402
from vllm.outputs import CompletionOutput as VllmCompletionOutput  # noqa: E402
from vllm.outputs import RequestOutput as VllmRequestOutput  # noqa: E402
from vllm.sampling_params import RequestOutputKind as VllmOutputKind  # noqa: E402
from vllm.v1.engine.async_llm import AsyncLLM  # noqa: E402

from dynamo_ctx import Context  # noqa: E402
from dynamo_ctx.backends import mocker  # noqa: E402
from dynamo_ctx.backends import vllm as handlers  # noqa: E402
from dynamo_ctx.backends.mocker import MockAsyncLLM, MockEngineArgs  # noqa: E402
from dynamo_ctx.backends.vllm import AggregatedHandler, DecodeHandler, PrefillHandler  # noqa: E402
from harness import HANG, child_env, run_python  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
PYTHON_DIR = ROOT / "python"
VLLM_HANG = 2 * HANG  # vLLM's import and engine start take a while: twice the harness's bound

#: The worker's source files (read for the import of EngineDeadError).
WORKER_SOURCES = [PYTHON_DIR / "dynamo_ctx" / "cli" / "worker.py", PYTHON_DIR / "dynamo_ctx" / "backends" / "vllm.py"]

#: Engine arguments as `vllm serve` spells them (the model directory is added per test).
ENGINE_ARGV = [
    "--max-num-seqs", "8", "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.3", "--max-model-len", "512", "--enforce-eager",
    "--kv-transfer-config", '{"kv_connector":"ExampleConnector","kv_role":"kv_both"}',
]


# --------------------------------------------------------------------------- the device


def _platform_needs_cpu_shim() -> bool:
    """VLLM_TARGET_DEVICE=cpu asked for, and vLLM found no platform (vLLM 0.26 on a machine without a GPU)."""
    if os.environ.get("VLLM_TARGET_DEVICE", "").lower() != "cpu":
        return False
    return not vllm.platforms.current_platform.device_type


def _install_cpu_platform() -> None:
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()


CPU_SHIM = _platform_needs_cpu_shim()
if CPU_SHIM:
    _install_cpu_platform()

#: A worker process started with ``python -c WORKER_MAIN args...``: the same as
#: ``python -m dynamo_ctx.worker args...`` after installing vLLM's CPU platform
#: where this vLLM does not (see the module's docstring).
WORKER_MAIN = """\
import runpy, sys
import vllm.platforms as p
if not p.current_platform.device_type:
    from vllm.platforms.cpu import CpuPlatform
    p._current_platform = CpuPlatform()
sys.argv[0] = "dynamo_ctx.worker"
runpy.run_module("dynamo_ctx.worker", run_name="__main__", alter_sys=True)
"""


def _has_accelerator() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")


def _run_worker(args: List[str], env: Dict[str, str], literal: bool = False) -> subprocess.CompletedProcess:
    """``python -m dynamo_ctx.worker args`` (through WORKER_MAIN where the CPU shim is needed, unless ``literal``)."""
    cmd = ["-m", "dynamo_ctx.worker"] if literal or not CPU_SHIM else ["-c", WORKER_MAIN]
    return run_python(*cmd, *args, env=child_env(env.get("NATS_SERVER"), base=env), cwd=ROOT, timeout=VLLM_HANG)


# --------------------------------------------------------------------------- recording the handlers' calls


@dataclasses.dataclass
class Call:
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    outputs: List[Any] = dataclasses.field(default_factory=list)


class RecordingEngine(MockAsyncLLM):
    """The mock engine, recording every ``generate`` and ``abort`` call as made (and generate's outputs)."""

    def __init__(self, name: str, args: Optional[MockEngineArgs] = None) -> None:
        super().__init__(args or MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.0))
        self.name = name
        self.generate_calls: List[Call] = []
        self.abort_calls: List[Call] = []

    async def generate(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        call = Call(args, kwargs)
        self.generate_calls.append(call)
        inner = super().generate(*args, **kwargs)
        try:
            async for out in inner:
                call.outputs.append(out)
                yield out
        finally:
            await inner.aclose()

    async def abort(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.abort_calls.append(Call(args, kwargs))
        return await super().abort(*args, **kwargs)


class _Item:
    def __init__(self, data: Any) -> None:
        self._data = data

    def data(self) -> Any:
        return self._data


class InProcessPrefillClient:
    """A prefill worker's client that calls a PrefillHandler in this process
    (items go through JSON, as on the request plane)."""

    def __init__(self, handler: PrefillHandler) -> None:
        self.handler = handler

    async def generate(self, request: Dict[str, Any], context: Any = None) -> Any:
        async def stream() -> Any:
            async for item in self.handler.generate(json.loads(json.dumps(request)), context):
                yield _Item(json.loads(json.dumps(item)))

        return stream()


@dataclasses.dataclass
class ParamsCall:
    """One ``sampling_params_for(engine, max_tokens, options)`` call of the handlers."""

    engine: Any
    max_tokens: int
    options: Dict[str, Any]
    result: Any


@dataclasses.dataclass
class Recorded:
    engines: List[RecordingEngine]
    params_calls: List[ParamsCall]
    scenarios: Dict[str, Any]

    def generate_calls(self) -> List[Tuple[str, Call]]:
        return [(e.name, c) for e in self.engines for c in e.generate_calls]

    def abort_calls(self) -> List[Tuple[str, Call]]:
        return [(e.name, c) for e in self.engines for c in e.abort_calls]


REQUEST = {
    "token_ids": list(range(1, 41)),
    "stop_conditions": {"max_tokens": 6, "stop_token_ids": [31999], "ignore_eos": True},
    "sampling_options": {"seed": 7, "temperature": 0.5, "top_p": 0.9, "presence_penalty": 0.1, "frequency_penalty": 0.2},
}


async def _drain(gen: Any, stop_after: Optional[int] = None, ctx: Optional[Context] = None) -> List[Dict[str, Any]]:
    items = []
    async for item in gen:
        items.append(item)
        if stop_after is not None and len(items) == stop_after and ctx is not None:
            ctx.stop_generating()
    return items


async def _scenarios(engines: Dict[str, RecordingEngine]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    # Aggregated, to the end.
    agg = AggregatedHandler(engines["agg"], "m")
    out["agg"] = await _drain(agg.generate(dict(REQUEST), Context("contract-agg")))
    # Aggregated, cancelled mid-stream: the monitor aborts the engine.
    slow = AggregatedHandler(engines["agg-cancel"], "m")
    ctx = Context("contract-agg-cancel")
    out["agg-cancel"] = await _drain(slow.generate({"token_ids": [1, 2, 3], "max_tokens": 100_000}, ctx), 3, ctx)
    # Disaggregated, to the end: decode calls the prefill worker, then decodes.
    prefill = PrefillHandler(engines["prefill"], "m")
    decode = DecodeHandler(engines["decode"], InProcessPrefillClient(prefill), "m")
    out["disagg"] = await _drain(decode.generate(dict(REQUEST), Context("contract-disagg")))
    # Disaggregated, cancelled during decode.
    prefill2 = PrefillHandler(engines["prefill-2"], "m")
    decode2 = DecodeHandler(engines["decode-cancel"], InProcessPrefillClient(prefill2), "m")
    ctx = Context("contract-disagg-cancel")
    out["disagg-cancel"] = await _drain(decode2.generate({"token_ids": list(range(1, 41)), "max_tokens": 100_000}, ctx), 3, ctx)
    return out


@pytest.fixture(scope="module")
def recorded() -> Recorded:
    slow = MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.001)
    engines = {
        "agg": RecordingEngine("agg"),
        "agg-cancel": RecordingEngine("agg-cancel", slow),
        "prefill": RecordingEngine("prefill"),
        "decode": RecordingEngine("decode"),
        "prefill-2": RecordingEngine("prefill-2"),
        "decode-cancel": RecordingEngine("decode-cancel", dataclasses.replace(slow)),
    }
    params_calls: List[ParamsCall] = []
    original = handlers.sampling_params_for

    def recording_sampling_params_for(engine: Any, max_tokens: int, options: Optional[Dict[str, Any]] = None) -> Any:
        result = original(engine, max_tokens, options)
        params_calls.append(ParamsCall(engine, max_tokens, dict(options or {}), result))
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(handlers, "sampling_params_for", recording_sampling_params_for)
        scenarios = asyncio.run(asyncio.wait_for(_scenarios(engines), VLLM_HANG))
    return Recorded(list(engines.values()), params_calls, scenarios)


def _bind(fn: Any, call: Call) -> inspect.BoundArguments:
    return inspect.signature(fn).bind(object(), *call.args, **call.kwargs)


def _vllm_engine_stand_in() -> Any:
    """An object whose class comes from a ``vllm`` module: sampling_params_for builds vLLM's SamplingParams for it."""
    return type("AsyncLLM", (), {"__module__": AsyncLLM.__module__})()


# --------------------------------------------------------------------------- the handlers' calls


def test_scenarios_ran(recorded: Recorded) -> None:
    s = recorded.scenarios
    tokens = lambda items: [t for it in items for t in it["token_ids"]]  # noqa: E731
    assert len(tokens(s["agg"])) == REQUEST["stop_conditions"]["max_tokens"]
    assert len(tokens(s["disagg"])) == REQUEST["stop_conditions"]["max_tokens"]
    assert tokens(s["disagg"]) == tokens(s["agg"]), "a disaggregated stream is the aggregated one, token for token"
    assert recorded.abort_calls(), "the cancelled requests aborted nothing"
    names = {name for name, _ in recorded.abort_calls()}
    assert {"agg-cancel", "decode-cancel"} <= names


def test_generate_calls_bind_to_vllm_signature(recorded: Recorded) -> None:
    calls = recorded.generate_calls()
    assert len(calls) >= 6
    for name, call in calls:
        try:
            bound = _bind(AsyncLLM.generate, call)
        except TypeError as e:
            pytest.fail(f"{name}: generate{call.args[:1]}..., kwargs {sorted(call.kwargs)} does not bind to AsyncLLM.generate: {e}")
        assert isinstance(bound.arguments["request_id"], str), f"{name}: request_id {bound.arguments['request_id']!r}"


def test_generate_prompts_are_vllm_tokens_prompts(recorded: Recorded) -> None:
    from vllm.inputs import TokensPrompt

    allowed = set(TokensPrompt.__annotations__)
    required = set(getattr(TokensPrompt, "__required_keys__", {"prompt_token_ids"}))
    for name, call in recorded.generate_calls():
        prompt = call.args[0] if call.args else call.kwargs.get("prompt")
        assert isinstance(prompt, dict), f"{name}: prompt {prompt!r} is not a TokensPrompt dict"
        assert required <= set(prompt) <= allowed, f"{name}: prompt keys {sorted(prompt)}, TokensPrompt has {sorted(allowed)}"
        assert all(isinstance(t, int) for t in prompt["prompt_token_ids"]), name


def test_abort_calls_bind_to_vllm_signature(recorded: Recorded) -> None:
    calls = recorded.abort_calls()
    assert calls
    for name, call in calls:
        try:
            bound = _bind(AsyncLLM.abort, call)
        except TypeError as e:
            pytest.fail(f"{name}: abort args {call.args!r} kwargs {call.kwargs!r} does not bind to AsyncLLM.abort: {e}")
        rid = bound.arguments["request_id"]
        assert isinstance(rid, str) or all(isinstance(r, str) for r in rid), f"{name}: request_id {rid!r}"
    # Each abort names a request that engine ran.
    for engine in recorded.engines:
        started = {_bind(AsyncLLM.generate, c).arguments["request_id"] for c in engine.generate_calls}
        for call in engine.abort_calls:
            assert _bind(AsyncLLM.abort, call).arguments["request_id"] in started, engine.name


def test_sampling_params_build_vllm_sampling_params(recorded: Recorded) -> None:
    """Each sampling_params_for call of the handlers, made again for a vLLM engine, builds vLLM's SamplingParams."""
    assert len(recorded.params_calls) >= 6
    stand_in = _vllm_engine_stand_in()
    for pc in recorded.params_calls:
        try:
            real = handlers.sampling_params_for(stand_in, pc.max_tokens, pc.options)
        except Exception as e:  # noqa: BLE001 - the report names it
            pytest.fail(f"SamplingParams(max_tokens={pc.max_tokens}, **{pc.options!r}) is refused by vLLM: {type(e).__name__}: {e}")
        assert isinstance(real, VllmSamplingParams), type(real)
        assert real.max_tokens == pc.max_tokens
        assert real.output_kind == VllmOutputKind.DELTA, "the handlers read deltas"
        assert real.detokenize is False, "the frontend makes the text"
        for key, value in pc.options.items():
            if key in ("seed", "stop_token_ids", "ignore_eos", "min_tokens", "extra_args", "detokenize"):
                assert getattr(real, key) == value, key


def test_mock_sampling_params_construct_vllm_ones(recorded: Recorded) -> None:
    """Every SamplingParams the handlers gave the mock, all its fields as keywords, builds vLLM's."""
    for name, call in recorded.generate_calls():
        params = _bind(AsyncLLM.generate, call).arguments["sampling_params"]
        assert isinstance(params, mocker.SamplingParams), f"{name}: {type(params)}"
        kwargs = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
        if isinstance(kwargs.get("output_kind"), enum.Enum):
            kwargs["output_kind"] = VllmOutputKind[kwargs["output_kind"].name]
        try:
            real = VllmSamplingParams(**kwargs)
        except Exception as e:  # noqa: BLE001 - the report names it
            pytest.fail(f"{name}: vllm.SamplingParams(**{kwargs!r}) fails: {type(e).__name__}: {e}")
        for key in ("max_tokens", "min_tokens", "seed", "stop_token_ids", "ignore_eos", "output_kind", "detokenize", "extra_args"):
            if key in kwargs:
                assert getattr(real, key) == kwargs[key], f"{name}: {key}"


def _kv_params(call: Call) -> Any:
    params = _bind(AsyncLLM.generate, call).arguments["sampling_params"]
    return (params.extra_args or {}).get("kv_transfer_params")


def test_kv_transfer_params_are_vllms_protocol(recorded: Recorded) -> None:
    by_name = {e.name: e for e in recorded.engines}
    for prefill_name, decode_name in (("prefill", "decode"), ("prefill-2", "decode-cancel")):
        [pcall] = by_name[prefill_name].generate_calls
        [dcall] = by_name[decode_name].generate_calls
        pbound, dbound = _bind(AsyncLLM.generate, pcall), _bind(AsyncLLM.generate, dcall)
        # Prefill: one token, do_remote_decode.
        assert pbound.arguments["sampling_params"].max_tokens == 1, "a disaggregated prefill runs with max_tokens=1"
        assert _kv_params(pcall) == {"do_remote_decode": True}
        # The prefill engine's own kv_transfer_params, from its last output...
        returned = [o.kv_transfer_params for o in pcall.outputs if getattr(o, "kv_transfer_params", None) is not None]
        assert returned, "the prefill engine returned no kv_transfer_params"
        # ... are the decode request's extra_args["kv_transfer_params"], as they are.
        assert _kv_params(dcall) == returned[-1], "the decode engine must get the prefill's RequestOutput.kv_transfer_params"
        # Decode runs the original prompt (vLLM's connectors load its KV; the decode engine makes every token).
        assert pbound.arguments["prompt"] == dbound.arguments["prompt"] == {"prompt_token_ids": list(range(1, 41))}
    for name in ("agg", "agg-cancel"):
        for call in by_name[name].generate_calls:
            assert _kv_params(call) is None, f"{name}: an aggregated request asks no KV transfer"


# --------------------------------------------------------------------------- what the handlers and the worker read


def _real_request_output() -> Any:
    completion = VllmCompletionOutput(index=0, text="", token_ids=[5], cumulative_logprob=None, logprobs=None, finish_reason="length")
    values = {
        "request_id": "r", "prompt": None, "prompt_token_ids": [1, 2], "prompt_logprobs": None, "outputs": [completion], "finished": True,
    }
    sig = inspect.signature(VllmRequestOutput.__init__)
    kwargs = {
        n: values.get(n)
        for n, p in list(sig.parameters.items())[1:]
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    return VllmRequestOutput(**kwargs, kv_transfer_params={"do_remote_prefill": True})


def test_outputs_have_what_the_handlers_read() -> None:
    out = _real_request_output()
    assert out.finished is True
    assert out.kv_transfer_params == {"do_remote_prefill": True}
    o = out.outputs[0]
    assert list(o.token_ids) == [5] and o.finish_reason == "length"
    assert VllmOutputKind.DELTA.name == "DELTA"


def test_engine_has_what_the_worker_reads() -> None:
    for name in ("errored", "dead_error", "is_running"):
        assert isinstance(inspect.getattr_static(AsyncLLM, name, None), property), f"AsyncLLM.{name} is not a property"
    # engine.model_config.max_model_len: EngineClient declares model_config, AsyncLLM is one.
    from vllm.config import ModelConfig
    from vllm.engine.protocol import EngineClient

    assert issubclass(AsyncLLM, EngineClient)
    assert "model_config" in EngineClient.__annotations__
    assert "max_model_len" in {f.name for f in dataclasses.fields(ModelConfig)}
    assert callable(getattr(AsyncLLM, "get_tokenizer", None))
    assert "engine_args" in inspect.signature(AsyncLLM.from_engine_args).parameters
    # engine.vllm_config.scheduler_config.max_num_seqs: the capacity the worker publishes.
    from vllm.config import SchedulerConfig

    assert "max_num_seqs" in {f.name for f in dataclasses.fields(SchedulerConfig)}
    assert "self.vllm_config" in inspect.getsource(AsyncLLM.__init__)


def test_prompts_are_rendered_where_vllm_takes_them_so() -> None:
    """Where this vLLM's ``AsyncLLM`` takes a rendered input, the worker renders
    each prompt itself (backends/vllm.py, ``_engine_input``): its call binds to
    the renderer's ``render_cmpl``, and the input that makes is what
    ``add_request`` takes as it is. Elsewhere the raw prompt goes, as before."""
    from dynamo_ctx.backends.vllm import _renders

    if not _renders(AsyncLLM):
        pytest.skip("this vLLM renders the worker's prompts itself")
    from vllm.renderers.base import BaseRenderer
    from vllm.renderers.inputs.preprocess import parse_model_prompt
    from vllm.renderers.params import TokenizeParams

    inspect.signature(parse_model_prompt).bind(object(), {"prompt_token_ids": [1, 2]})
    inspect.signature(BaseRenderer.render_cmpl).bind(object(), [{"prompt_token_ids": [1, 2]}], object())
    inspect.signature(TokenizeParams.with_kwargs).bind(object())
    assert "self.input_processor.process_inputs(" in inspect.getsource(AsyncLLM.add_request)


# --------------------------------------------------------------------------- the mock's surface


def _compatibility_problems(mock_fn: Any, real_fn: Any) -> List[str]:
    """How calling ``mock_fn`` the way it accepts could differ from calling ``real_fn`` (empty: compatible)."""
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    mock = list(inspect.signature(mock_fn).parameters.values())[1:]
    real = list(inspect.signature(real_fn).parameters.values())[1:]
    real_at = {p.name: (i, p) for i, p in enumerate(real)}
    problems = []
    for i, p in enumerate(mock):
        if p.kind in kinds:
            if not any(q.kind == p.kind for q in real):
                problems.append(f"the mock takes {p}, vLLM's does not")
            continue
        if p.name not in real_at:
            problems.append(f"the mock {'requires' if p.default is p.empty else 'accepts'} {p.name!r}, vLLM's has no such parameter")
            continue
        j, q = real_at[p.name]
        if p.kind != q.kind:
            problems.append(f"{p.name!r} is {p.kind.description} in the mock, {q.kind.description} in vLLM")
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and i != j:
            problems.append(f"{p.name!r} is positional {i} in the mock, {j} in vLLM")
    names = {p.name for p in mock}
    for q in real:
        if q.default is q.empty and q.kind not in kinds and q.name not in names:
            problems.append(f"vLLM's requires {q.name!r}, the mock has no such parameter")
    return problems


@pytest.mark.parametrize("method", ["generate", "add_request", "abort"])
def test_mock_signatures_are_a_compatible_subset(method: str) -> None:
    mock_fn, real_fn = getattr(MockAsyncLLM, method), getattr(AsyncLLM, method)
    assert _compatibility_problems(mock_fn, real_fn) == [], f"MockAsyncLLM.{method}{inspect.signature(mock_fn)}"
    assert inspect.isasyncgenfunction(mock_fn) == inspect.isasyncgenfunction(real_fn)
    assert inspect.iscoroutinefunction(mock_fn) == inspect.iscoroutinefunction(real_fn)


def test_pushed_outputs_use_vllms_collector() -> None:
    """A served handler pushes its outputs (backends/vllm.py, _Pushed): it calls
    ``add_request(request_id, prompt, params)``, replaces ``put`` on the collector
    that returns, and takes what it already holds with ``get_nowait``. vLLM's
    collector has both, takes the replacement (an instance attribute), and its
    output processor hands each output to ``queue.put``."""
    from vllm.v1.engine import output_processor

    collector = output_processor.RequestOutputCollector
    assert callable(getattr(collector, "put", None)) and callable(getattr(collector, "get_nowait", None))
    assert "__slots__" not in vars(collector), "put cannot be replaced on an instance"
    assert ".queue.put(" in inspect.getsource(output_processor), "vLLM's output processor no longer calls queue.put"
    params = list(inspect.signature(AsyncLLM.add_request).parameters)
    assert params[1:4] == ["request_id", "prompt", "params"]
    assert inspect.iscoroutinefunction(AsyncLLM.add_request)
    assert "RequestOutputCollector" in str(inspect.signature(AsyncLLM.add_request).return_annotation)


def test_pushed_add_request_calls_bind_to_vllm_signature() -> None:
    """The calls a served handler makes (add_request, abort on a stop) bind to vLLM's."""
    from dynamo_ctx import serving

    calls: List[Tuple[str, Call]] = []

    class Engine(MockAsyncLLM):
        async def add_request(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            calls.append(("add_request", Call(args, kwargs)))
            return await super().add_request(*args, **kwargs)

        async def abort(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            calls.append(("abort", Call(args, kwargs)))
            return await super().abort(*args, **kwargs)

    async def main() -> List[Any]:
        engine = Engine(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.001))
        items: List[Any] = []
        serving._sink.set(items.append)  # as _relay sets it for a served request
        handler = AggregatedHandler(engine, "m")
        async for _ in handler.generate(dict(REQUEST), Context("pushed")):
            pass
        first = len(items)
        serving._sink.set(items.append)  # the first request took it (item_sink)
        ctx = Context("pushed-stop")
        task = asyncio.ensure_future(handler.generate({"token_ids": [1, 2], "max_tokens": 100_000}, ctx).__anext__())
        for _ in range(int(VLLM_HANG / 0.001)):
            if len(items) >= first + 3:
                break
            await asyncio.sleep(0.001)
        ctx.stop_generating()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(task, VLLM_HANG)
        return items

    items = asyncio.run(main())
    assert items and [name for name, _ in calls].count("add_request") == 2 and any(name == "abort" for name, _ in calls)
    for name, call in calls:
        bound = _bind(getattr(AsyncLLM, name), call)
        if name == "add_request":
            assert isinstance(bound.arguments["request_id"], str)
            assert isinstance(bound.arguments["prompt"], dict) and "prompt_token_ids" in bound.arguments["prompt"]
            real = handlers.sampling_params_for(_vllm_engine_stand_in(), bound.arguments["params"].max_tokens, {"detokenize": False})
            assert isinstance(real, VllmSamplingParams)


def test_mock_engine_state_is_vllms() -> None:
    """What the worker reads on an engine: the mock has it as vLLM's AsyncLLM has it."""
    for name in ("errored", "is_running"):
        assert isinstance(inspect.getattr_static(MockAsyncLLM, name, None), property), name
    assert hasattr(MockAsyncLLM(), "dead_error")


def _vllm_sampling_fields() -> set:
    fields = getattr(VllmSamplingParams, "__struct_fields__", None)
    if fields is None:
        fields = [f.name for f in dataclasses.fields(VllmSamplingParams)]
    return set(fields)


def test_mock_sampling_params_fields_are_vllms() -> None:
    mock_fields = {f.name for f in dataclasses.fields(mocker.SamplingParams)}
    assert mock_fields - _vllm_sampling_fields() == set()
    # Each default builds vLLM's too.
    defaults = dataclasses.asdict(mocker.SamplingParams())
    defaults["output_kind"] = VllmOutputKind[mocker.SamplingParams().output_kind.name]
    VllmSamplingParams(**defaults)


def test_request_output_kind_members_match() -> None:
    assert {m.name: m.value for m in mocker.RequestOutputKind} == {m.name: m.value for m in VllmOutputKind}


def test_mock_output_fields_exist_in_vllm() -> None:
    real = _real_request_output()
    for f in dataclasses.fields(mocker.RequestOutput):
        assert hasattr(real, f.name), f"vLLM's RequestOutput has no {f.name!r}"
    for f in dataclasses.fields(mocker.CompletionOutput):
        assert hasattr(real.outputs[0], f.name), f"vLLM's CompletionOutput has no {f.name!r}"


# --------------------------------------------------------------------------- the worker


def _worker() -> Any:
    from dynamo_ctx.cli import worker

    return worker


def test_worker_parses_vllm_engine_arguments(tmp_path: Path) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    worker = _worker()
    args = worker.parse_args(["--engine", "vllm", "--model", str(tmp_path)] + ENGINE_ARGV)
    assert args.engine == "vllm"
    build = getattr(worker, "engine_args", None)
    assert build is not None, "dynamo_ctx.cli.worker has no engine_args(args) building AsyncEngineArgs"
    ea = build(args)
    assert isinstance(ea, AsyncEngineArgs)
    assert ea.model == str(tmp_path)
    assert ea.max_num_seqs == 8 and ea.gpu_memory_utilization == 0.3 and ea.max_model_len == 512
    kv = ea.kv_transfer_config
    kv_connector = kv.get("kv_connector") if isinstance(kv, dict) else kv.kv_connector
    kv_role = kv.get("kv_role") if isinstance(kv, dict) else kv.kv_role
    assert (kv_connector, kv_role) == ("ExampleConnector", "kv_both")
    # The parse is vLLM's own: what `vllm serve`'s parser makes of the same arguments.
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    ref = AsyncEngineArgs.from_cli_args(serve.parse_args(["--model", str(tmp_path)] + ENGINE_ARGV))
    differ = [
        f.name for f in dataclasses.fields(AsyncEngineArgs)
        if f.name != "kv_transfer_config" and getattr(ea, f.name) != getattr(ref, f.name)
    ]
    assert differ == [], "the worker's engine arguments differ from vllm serve's: " + ", ".join(
        f"{n}={getattr(ea, n)!r} (vllm serve: {getattr(ref, n)!r})" for n in differ
    )


def test_worker_help_lists_vllm_engine_arguments() -> None:
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    r = _run_worker(["--engine", "vllm", "--help"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    for flag in ("--tensor-parallel-size", "--kv-transfer-config", "--max-num-seqs", "--gpu-memory-utilization", "--max-model-len",
                 "--model", "--engine", "--mode"):
        assert flag in r.stdout, f"{flag} is not in the worker's --help"


@pytest.mark.skipif(_has_accelerator(), reason="this machine has a GPU: vLLM finds its device itself")
def test_worker_help_without_a_gpu_needs_no_setting() -> None:
    """`python -m dynamo_ctx.worker --engine vllm --help`, as typed, on a machine without a GPU and
    without VLLM_TARGET_DEVICE: the worker's docstring says it still shows vLLM's arguments."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    r = _run_worker(["--engine", "vllm", "--help"], env, literal=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--tensor-parallel-size" in r.stdout


# --------------------------------------------------------------------------- engine death


def _engine_dead_imports() -> List[str]:
    """The modules the worker's sources import EngineDeadError from."""
    found = []
    for path in WORKER_SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and any(a.name == "EngineDeadError" for a in node.names):
                found.append(node.module)
    return found


def test_engine_dead_error_is_where_the_worker_looks() -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    for module in _engine_dead_imports():
        if module.startswith("vllm"):
            mod = importlib.import_module(module)
            assert getattr(mod, "EngineDeadError", None) is EngineDeadError, f"{module}.EngineDeadError"
    # The handlers tell engine death by the exception (vLLM's, or the mock's of that name).
    is_dead = getattr(handlers, "is_engine_dead", None)
    if is_dead is not None:
        assert is_dead(EngineDeadError(), None) is True
        assert is_dead(RuntimeError("one request failed"), None) is False
