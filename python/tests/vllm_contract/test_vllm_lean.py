"""The short way around vLLM's output processor (dynamo_ctx/backends/vllm_lean.py)
against vLLM's own: the same engine-core outputs, fed to two of vLLM's
``OutputProcessor`` (one with the short way installed, one without), give the
request the same tokens, the same last output, the same statistics and the same
state left behind. Where the installed vLLM is not the one the short way was
written against, it installs nothing, which these tests check instead.

Run by ``make test-vllm`` (with vLLM installed; skipped elsewhere).
"""

from __future__ import annotations

import importlib.util
import time

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed here: `make test-vllm` runs these tests", allow_module_level=True)

from types import SimpleNamespace  # noqa: E402
from typing import Any, List, Optional, Tuple  # noqa: E402

from vllm import SamplingParams  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector  # noqa: E402
from vllm.v1.metrics.stats import IterationStats, PrefillStats  # noqa: E402

from dynamo_ctx.backends import vllm_lean  # noqa: E402


def _request(rid: str, **sampling: Any) -> Any:
    """vLLM's EngineCoreRequest for a 3-token prompt (every field it requires; None
    for those this test has nothing for)."""
    params = SamplingParams(max_tokens=8, detokenize=False, output_kind=RequestOutputKind.DELTA, **sampling)
    given = {"request_id": rid, "prompt_token_ids": [1, 2, 3], "sampling_params": params, "arrival_time": time.time(),
             "external_req_id": rid}
    fields = EngineCoreRequest.__struct_fields__
    required = fields[: len(fields) - len(EngineCoreRequest.__struct_defaults__)]
    return EngineCoreRequest(**{f: given.get(f) for f in required}, **{f: v for f, v in given.items() if f not in required})


def _processor(lean: bool) -> Tuple[OutputProcessor, Optional[vllm_lean.LeanOutputs]]:
    processor = OutputProcessor(None, log_stats=True)
    installed = vllm_lean.LeanOutputs.install(SimpleNamespace(output_processor=processor)) if lean else None
    return processor, installed


#: The engine's timestamps of the outputs fed (step i at _T0 + i/100), the same in
#: every run, so that the inter-token latencies compare exactly.
_T0 = time.monotonic()


def _outputs(rid: str, steps: int) -> List[Any]:
    """A request's engine-core outputs: its first token (with the prefill's
    statistics), plain tokens, and a last one that finishes it."""
    prefill = PrefillStats(num_prompt_tokens=3, num_computed_tokens=2, num_cached_tokens=1, num_local_cached_tokens=1)
    out = [EngineCoreOutput(request_id=rid, new_token_ids=[10], prefill_stats=prefill)]
    out += [EngineCoreOutput(request_id=rid, new_token_ids=[11 + i]) for i in range(steps)]
    out.append(EngineCoreOutput(request_id=rid, new_token_ids=[99], finish_reason=FinishReason.LENGTH))
    return out


def _run(lean: bool, **sampling: Any) -> Tuple[List[Any], List[Any], Any, OutputProcessor, bool]:
    """Feed one request's outputs, a step each; what reached it (token lists by the
    short way, RequestOutputs by vLLM's), the statistics, the processor, and
    whether it was routed."""
    processor, installed = _processor(lean)
    rid = "req-1"
    collector = RequestOutputCollector(RequestOutputKind.DELTA, rid)
    outputs: List[Any] = []
    collector.put = outputs.append  # type: ignore[method-assign]  # as backends/vllm.py's _Pushed does
    processor.add_request(_request(rid, **sampling), None, None, 0, collector)
    tokens: List[Any] = []
    routed = installed.route(rid, tokens.append) if installed is not None else False
    stats = []
    for i, out in enumerate(_outputs(rid, 4)):
        it = IterationStats()
        result = processor.process_outputs([out], _T0 + i * 0.01, it, weight_version="default")
        assert not result.request_outputs and not result.reqs_to_abort
        stats.append(_figures(it))
    return tokens, outputs, stats, processor, routed


def _itl(it: Any) -> Any:
    return getattr(it, "inter_token_latencies_iter", None) or []


def _figures(it: Any) -> Tuple[Any, ...]:
    """What a step's statistics say, as far as two runs must agree: the tokens, the
    prompt's (by source), the first tokens and finishes seen, the inter-token
    latencies (the engine's timestamps are the same in both)."""
    prompt = it.prompt_token_stats
    return (it.num_generation_tokens, it.num_prompt_tokens, prompt.computed, prompt.cached_tokens, prompt.local_cache_hit,
            len(it.time_to_first_tokens_iter), len(it.finished_requests), [round(x, 9) for x in _itl(it)])


def test_installs_on_the_vllm_it_knows_or_says_why() -> None:
    processor, installed = _processor(lean=True)
    why = vllm_lean._unlike(processor)
    assert (installed is None) == bool(why), why
    if why:
        # Nothing changed: vLLM's own method is still the processor's.
        assert "process_outputs" not in vars(processor)
        pytest.skip(f"the short way is off on this vLLM: {why}")


def test_same_tokens_statistics_and_end_as_vllms_own_way() -> None:
    if vllm_lean._unlike(_processor(lean=False)[0]):
        pytest.skip("the short way is off on this vLLM")
    tokens, outputs, stats, processor, routed = _run(lean=True)
    plain_tokens, plain_outputs, plain_stats, plain_processor, _ = _run(lean=False)
    assert routed
    # vLLM's way: a RequestOutput per output.
    assert [list(o.outputs[0].token_ids) for o in plain_outputs] == [[10], [11], [12], [13], [14], [99]]
    # The short way: the first (prefill) and last outputs still vLLM's, the plain ones straight through.
    assert [list(o.outputs[0].token_ids) for o in outputs] == [[10], [99]]
    assert tokens == [[11], [12], [13], [14]]
    last, plain_last = outputs[-1], plain_outputs[-1]
    assert last.finished and plain_last.finished
    assert last.outputs[0].finish_reason == plain_last.outputs[0].finish_reason == "length"
    assert stats == plain_stats  # tokens counted, prompt counted once, the first token, the finish, the inter-token latencies
    assert stats[0][1:6] == (3, 2, 1, 1, 1), "the prefill's statistics are in the figures compared"
    assert processor.request_states == {} == plain_processor.request_states
    assert not processor.external_req_ids.get("req-1") and not plain_processor.external_req_ids.get("req-1")


@pytest.mark.parametrize("sampling", [{"logprobs": 2}, {"n": 2, "seed": 1}], ids=["logprobs", "n=2"])
def test_requests_it_would_change_are_not_routed(sampling: Any) -> None:
    if vllm_lean._unlike(_processor(lean=False)[0]):
        pytest.skip("the short way is off on this vLLM")
    processor, installed = _processor(lean=True)
    assert installed is not None
    params_kind = RequestOutputKind.DELTA
    collector = RequestOutputCollector(params_kind, "req-2")
    if sampling.get("n", 1) > 1:
        # n > 1: vLLM fans out child requests under a parent; the route is asked for the parent's id.
        assert not installed.route("req-2", lambda ids: None)
        return
    processor.add_request(_request("req-2", **sampling), None, None, 0, collector)
    assert not installed.route("req-2", lambda ids: None)
    assert installed.routes == {}


def test_outputs_of_unrouted_requests_go_vllms_way() -> None:
    if vllm_lean._unlike(_processor(lean=False)[0]):
        pytest.skip("the short way is off on this vLLM")
    tokens, outputs, _, processor, _ = _run(lean=True, logprobs=None)
    assert tokens and outputs  # routed: the baseline for the next
    processor, installed = _processor(lean=True)
    assert installed is not None
    collector = RequestOutputCollector(RequestOutputKind.DELTA, "req-3")
    got: List[Any] = []
    collector.put = got.append  # type: ignore[method-assign]
    processor.add_request(_request("req-3"), None, None, 0, collector)
    for out in _outputs("req-3", 2):
        processor.process_outputs([out], time.monotonic(), IterationStats(), weight_version="default")
    assert [list(o.outputs[0].token_ids) for o in got] == [[10], [11], [12], [99]]


def test_an_output_with_any_other_field_set_goes_vllms_way() -> None:
    """Each field of _UNSET set on an otherwise plain output of a routed request
    sends it to vLLM's own process_outputs, untouched (the check in the loop is
    spelled out by hand: this keeps it and _UNSET together)."""
    processor, installed = _processor(lean=True)
    if installed is None:
        pytest.skip("the short way is off on this vLLM")
    processor.add_request(_request("r"), None, None, 0, RequestOutputCollector(RequestOutputKind.DELTA, "r"))
    processor.request_states["r"].is_prefilling = False  # past its first output
    routed: List[Any] = []
    assert installed.route("r", routed.append)
    left: List[Any] = []
    installed._original = lambda rest, *a, **k: left.append(list(rest))  # type: ignore[method-assign]
    for field in vllm_lean._UNSET:
        out = EngineCoreOutput(request_id="r", new_token_ids=[1])
        setattr(out, field, object())
        routed.clear()
        left.clear()
        installed.process_outputs([out], time.monotonic(), IterationStats(), weight_version=None)
        assert routed == [] and left == [[out]], field


def test_a_check_that_fails_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM without its sources (inspect.getsource fails), or anything else the
    check meets: nothing installed, no error; the handler's engine lookup then
    answers None once and for all."""
    import inspect

    from dynamo_ctx.backends import vllm as handlers

    checks: List[Any] = []

    def no_source(*args: Any, **kwargs: Any) -> str:
        checks.append(args)
        raise OSError("could not get source code")

    monkeypatch.setattr(inspect, "getsource", no_source)
    processor, installed = _processor(lean=True)
    assert installed is None and "process_outputs" not in vars(processor)

    class Engine:  # what _lean_outputs sees: an AsyncLLM by its class's module and name
        pass

    Engine.__module__, Engine.__name__ = "vllm.v1.engine.async_llm", "AsyncLLM"
    engine = Engine()
    engine.output_processor = OutputProcessor(None, log_stats=True)  # type: ignore[attr-defined]
    checks.clear()
    assert handlers._lean_outputs(engine) is None
    assert handlers._lean_outputs(engine) is None
    assert len(checks) == 1  # checked at the first request only
    assert "process_outputs" not in vars(engine.output_processor)  # type: ignore[attr-defined]


class _Quiet:
    """A request's side of the library's deliveries (backends/vllm.py's _Pushed):
    counts what the library sent, and what vLLM's way makes while quiet."""

    def __init__(self) -> None:
        self.quiet = False
        self.counted: List[List[int]] = []

    def count(self, ids: List[int]) -> None:
        self.counted.append(list(ids))


@pytest.mark.parametrize("first", ["Delivered", "DeliveredExtra"])
def test_outputs_the_library_sent_keep_vllms_books_and_reach_nobody_again(first: str) -> None:
    """Outputs whose tokens the library sent itself (backends/vllm_outputs.py marks
    their new_token_ids) are counted and kept in vLLM's books as its own way keeps
    them, and reach the request no second time: the first output (its prefill,
    vLLM's way, quiet) and the plain ones (the short way, counted); the last one,
    which the library leaves to the worker, reaches it as before."""
    if vllm_lean._unlike(_processor(lean=False)[0]):
        pytest.skip("the short way is off on this vLLM")
    _, _, plain_stats, plain_processor, _ = _run(lean=False)
    processor, installed = _processor(lean=True)
    assert installed is not None
    rid = "req-1"
    q = _Quiet()
    collector = RequestOutputCollector(RequestOutputKind.DELTA, rid)
    outputs: List[Any] = []
    collector.put = lambda o: q.counted.append(list(o.outputs[0].token_ids)) if q.quiet else outputs.append(o)  # type: ignore[method-assign]
    processor.add_request(_request(rid), None, None, 0, collector)
    tokens: List[Any] = []
    assert installed.route(rid, tokens.append)
    installed.deliver_to(rid, q)
    stats = []
    for i, out in enumerate(_outputs(rid, 4)):
        if i == 0:
            out.new_token_ids = getattr(vllm_lean, first)(out.new_token_ids)
        elif not out.finished:
            out.new_token_ids = vllm_lean.Delivered(out.new_token_ids)
        it = IterationStats()
        result = processor.process_outputs([out], _T0 + i * 0.01, it, weight_version="default")
        assert not result.request_outputs and not result.reqs_to_abort
        assert not q.quiet, "quiet only while vLLM's way runs"
        stats.append(_figures(it))
    assert tokens == [], "nothing handed over by the short way"
    assert q.counted == [[10], [11], [12], [13], [14]]
    assert [list(o.outputs[0].token_ids) for o in outputs] == [[99]]
    assert outputs[0].finished
    assert stats == plain_stats
    assert processor.request_states == {} == plain_processor.request_states


def test_outputs_the_library_sent_for_a_request_that_ended_go_vllms_way() -> None:
    """A message the library forwarded after the request's route was dropped (its
    stream ended) while vLLM still holds the request: its outputs go vLLM's way,
    whose collector (ended) drops them."""
    processor, installed = _processor(lean=True)
    if installed is None:
        pytest.skip("the short way is off on this vLLM")
    left: List[Any] = []
    installed._original = lambda rest, *a, **k: left.append(list(rest))  # type: ignore[method-assign]
    installed.routes["other"] = lambda ids: None  # so that the short way runs at all
    processor.add_request(_request("gone"), None, None, 0, RequestOutputCollector(RequestOutputKind.DELTA, "gone"))
    out = EngineCoreOutput(request_id="gone", new_token_ids=vllm_lean.Delivered([1]))
    installed.process_outputs([out], time.monotonic(), IterationStats(), weight_version=None)
    assert left == [[out]]


@pytest.mark.parametrize("routed", [False, True])
def test_outputs_the_library_sent_for_an_aborted_request_are_still_counted(routed: bool) -> None:
    """The library's caller got these tokens before the worker booked them, and the
    request was aborted meanwhile (its state gone): they count as generated (vLLM's
    own way books an output before its caller sees it, so whatever its caller saw
    was counted), a first output's prompt with them; whether the request's route
    is still there or not. (An output the library did not send, its request
    stopped, is flagged 0: the worker's, which vLLM ignores once the state went.)"""
    processor, installed = _processor(lean=True)
    if installed is None:
        pytest.skip("the short way is off on this vLLM")
    installed.go = object()  # the library reads the engine's outputs
    if routed:
        installed.deliver_to("aborted", _Quiet())
    it = IterationStats()
    prefill = PrefillStats(num_prompt_tokens=5, num_computed_tokens=5)
    first = EngineCoreOutput(request_id="aborted", new_token_ids=vllm_lean.DeliveredExtra([1]), prefill_stats=prefill)
    out = EngineCoreOutput(request_id="aborted", new_token_ids=vllm_lean.Delivered([2, 3]))
    installed.process_outputs([first, out], time.monotonic(), it, weight_version=None)
    assert (it.num_generation_tokens, it.num_prompt_tokens) == (3, 5)
