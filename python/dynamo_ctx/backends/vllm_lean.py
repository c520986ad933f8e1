"""A shorter way for a pushed request's ordinary tokens, around vLLM's output processor.

vLLM's ``AsyncLLM`` turns every engine-core output into a ``RequestOutput`` (its output
processor) and puts it into the request's collector, whose ``put`` a pushed request
replaces (backends/vllm.py, ``_Pushed``); the handler then reads the tokens back out of
it. For the outputs in the middle of a plain decode (new tokens and nothing else) that
object is made only to be taken apart: this module routes them straight to the request,
and leaves every other output to vLLM.

``LeanOutputs.install(engine)`` replaces the engine's ``output_processor.process_outputs``
(on the instance) with one that, for each engine-core output of a routed request:

- takes the short way when the output carries new tokens only (no finish, logprobs,
  pooling, events, transfer parameters, prefill statistics, expert routing, sampling
  mask, cache misses or spec-decode metrics) and the request has left prefill: it
  records the output in vLLM's statistics (``_update_stats_from_output``), its weight
  version (``track_weight_version``) and its tokens in the request's detokenizer (one
  that only counts them), as vLLM does, and hands the tokens to the request
  (its ``Route``);
- else leaves it to vLLM's own ``process_outputs``, called once per step with the
  outputs left, which makes the request's ``RequestOutput`` and finishes it as before.

A request is routed (``route``) only when the short way changes nothing it would see:
one sequence (n = 1), deltas (``RequestOutputKind.DELTA``), a stream interval of 1, no
streaming input, no logprobs asked, and the detokenizer that only counts tokens
(``detokenize=False``, so no stop strings either). ``install`` checks that the running
vLLM is the one the short way was written against (``_unlike``); where it is not, or
the check fails, it installs nothing and every output goes vLLM's way, as before.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Dict, List, Optional, Protocol

logger = logging.getLogger("dynamo_ctx.backends.vllm")

#: The fields of vLLM's ``EngineCoreOutput`` that must all be unset (None) for
#: an output to take the short way; with ``finish_reason`` first, the one set
#: most often.
_UNSET = (
    "finish_reason", "stop_reason", "new_logprobs", "new_prompt_logprobs_tensors", "pooling_output", "events", "kv_transfer_params",
    "ec_transfer_params", "prefill_stats", "routed_experts", "mm_cache_miss_hashes", "new_sampling_mask",
    "spec_decode_metrics", "prompt_token_id_logprobs",
)


#: Where a routed request's tokens go: called with each plain output's new token
#: ids (a list it may keep); it must not raise.
Route = Callable[[List[int]], None]

#: Each engine's answer of ``LeanOutputs.of``.
_of_engine: "weakref.WeakKeyDictionary[Any, Optional[LeanOutputs]]" = weakref.WeakKeyDictionary()


class LeanOutputs:
    """The short way of one engine (see the module's docstring)."""

    def __init__(self, processor: Any, delta: Any, plain_detokenizer: type) -> None:
        self._original = processor.process_outputs
        self._states: Dict[str, Any] = processor.request_states
        self._stats = processor._update_stats_from_output
        self._delta = delta  # vLLM's RequestOutputKind.DELTA
        self._plain_detokenizer = plain_detokenizer
        self.routes: Dict[str, Route] = {}  # vLLM's request id -> where its tokens go
        # The library's reader of the engine's outputs, when it reads them
        # (vllm_outputs.py), and the requests whose plain tokens it sends itself:
        # vLLM's request id -> its Quiet side here.
        self.go: Any = None
        self.delivered_to: Dict[str, "Quiet"] = {}

    @classmethod
    def of(cls, engine: Any) -> Optional["LeanOutputs"]:
        """``engine``'s short way, installed at the first call for it: the answer
        (None too) is kept for the engine's life, so the check runs once. An error
        of the install is logged and answers None: the short way is an
        optimisation, never a request's failure."""
        try:
            return _of_engine[engine]
        except KeyError:
            pass
        except TypeError:
            return None  # an engine no weak reference can key: nowhere to keep the answer, so vLLM's way
        try:
            lean = cls.install(engine)
        except Exception:  # noqa: BLE001 - see the docstring
            logger.exception("vLLM's outputs all go through its output processor")
            lean = None
        _of_engine[engine] = lean
        return lean

    @classmethod
    def install(cls, engine: Any) -> Optional["LeanOutputs"]:
        """Put the short way on ``engine`` (vLLM's ``AsyncLLM``) and return it; None
        where this vLLM is not the one it was written against (``_unlike``: nothing
        is changed then, and every output goes vLLM's way). Once per engine: ``of``."""
        try:
            from vllm.sampling_params import RequestOutputKind  # type: ignore[import-not-found]
            from vllm.v1.engine.detokenizer import IncrementalDetokenizer  # type: ignore[import-not-found]

            processor = engine.output_processor
            why = _unlike(processor)
        except Exception as e:  # noqa: BLE001 - whatever the check meets (no sources, an odd signature): vLLM's way
            why = repr(e)
        if why:
            logger.info("vLLM's outputs all go through its output processor: %s", why)
            return None
        lean = cls(processor, RequestOutputKind.DELTA, IncrementalDetokenizer)
        processor.process_outputs = lean.process_outputs
        logger.info("vLLM's plain decode outputs go past its output processor, straight to their requests")
        return lean

    def route(self, request_id: str, route: Route) -> bool:
        """Send ``request_id``'s plain outputs to ``route`` (vLLM's request id: its
        collector's ``request_id``); False, and nothing routed, where the request
        is not one the short way serves unchanged."""
        state = self._states.get(request_id)
        try:
            plain = not (
                state is None
                or state.n not in (None, 1)
                or state.parent_req is not None
                or state.output_kind != self._delta
                or state.stream_interval != 1
                or state.streaming_input
                or state.logprobs_processor is None
                or state.logprobs_processor.logprobs is not None
                or state.logprobs_processor.prompt_logprobs is not None
                or type(state.detokenizer) is not self._plain_detokenizer
            )
        except AttributeError:
            plain = False  # a request state unlike the one install checked
        if not plain:
            return False
        self.routes[request_id] = route
        return True

    def deliver_to(self, request_id: str, quiet: "Quiet") -> None:
        """Record that the library sends ``request_id``'s plain tokens itself (a
        routed request's: vllm_outputs.py): the outputs it delivered (their
        ``new_token_ids`` a ``Delivered`` list) are kept in vLLM's books and
        counted on ``quiet``, never handed over again."""
        self.delivered_to[request_id] = quiet

    def unroute(self, request_id: str) -> None:
        """Forget ``request_id``'s route (its outputs go vLLM's way after this)."""
        self.routes.pop(request_id, None)
        self.delivered_to.pop(request_id, None)

    def process_outputs(self, engine_core_outputs: List[Any], engine_core_timestamp: Optional[float] = None,
                        iteration_stats: Any = None, weight_version: Optional[str] = None) -> Any:
        """vLLM's ``OutputProcessor.process_outputs``, the short way for what it can."""
        routes = self.routes
        if not routes and self.go is None:  # with the library's reader, its outputs may outlive their routes
            return self._original(engine_core_outputs, engine_core_timestamp, iteration_stats, weight_version=weight_version)
        rest = []
        quiet: List[Quiet] = []
        states, stats, delivered_to = self._states, self._stats, self.delivered_to
        for out in engine_core_outputs:
            route = routes.get(out.request_id)
            to: Optional[Quiet] = None
            kind = type(out.new_token_ids)
            if kind is not list and (kind is Delivered or kind is DeliveredExtra):
                # The library sent its tokens itself (vllm_outputs.py): vLLM's books only.
                to = delivered_to.get(out.request_id)
                if to is None:
                    if out.request_id not in states:
                        _count_sent(out, iteration_stats)
                        continue
                    rest.append(out)  # the request ended meanwhile: vLLM's way, and its collector drops it
                    continue
                route = to.count
                if kind is DeliveredExtra:
                    if out.request_id not in states:
                        _count_sent(out, iteration_stats)  # aborted meanwhile: as a plain one below
                        continue
                    quiet.append(to)  # vLLM's way keeps its books (events, prefill statistics)
                    rest.append(out)
                    continue
            # Every field of _UNSET unset, spelled out: this runs for every token.
            elif route is None or not (
                out.finish_reason is None and out.stop_reason is None and out.new_logprobs is None
                and out.new_prompt_logprobs_tensors is None and out.pooling_output is None and out.events is None
                and out.kv_transfer_params is None and out.ec_transfer_params is None and out.prefill_stats is None
                and out.routed_experts is None and out.mm_cache_miss_hashes is None and out.new_sampling_mask is None
                and out.spec_decode_metrics is None and out.prompt_token_id_logprobs is None
            ):
                rest.append(out)
                continue
            state = states.get(out.request_id)
            if state is None:
                if to is not None:
                    _count_sent(out, iteration_stats)
                continue  # aborted: vLLM ignores its outputs too
            if state.is_prefilling:
                rest.append(out)  # its first output: vLLM's way records the prefill
                if to is not None:
                    quiet.append(to)
                continue
            stats(state, out, engine_core_timestamp, iteration_stats)
            ids = out.new_token_ids
            if ids and weight_version is not None:
                state.track_weight_version(weight_version)  # before the tokens, as vLLM
            state.detokenizer.update(ids, False)
            route(ids)
        if not quiet:
            return self._original(rest, engine_core_timestamp, iteration_stats, weight_version=weight_version)
        for to in quiet:
            to.quiet = True  # what vLLM's way makes of these outputs is dropped
        try:
            return self._original(rest, engine_core_timestamp, iteration_stats, weight_version=weight_version)
        finally:
            for to in quiet:
                to.quiet = False


class Quiet(Protocol):
    """A request's side for the outputs whose tokens the library sent itself."""

    quiet: bool  # set while vLLM's way handles such an output: what it makes of it is dropped

    def count(self, ids: List[int]) -> None:
        """Count ``ids``, sent by the library."""


def _count_sent(out: Any, iteration_stats: Any) -> None:
    """Count in vLLM's statistics the tokens (and a first output's prompt) of an
    output the library sent for a request aborted before the worker's books saw
    it: its caller got them, so they were generated. (vLLM's own reader books an
    output before its caller sees it; the library's caller sees it first. The
    request's own figures, gone with its state, are not kept.)"""
    if iteration_stats is None:
        return
    iteration_stats.num_generation_tokens += len(out.new_token_ids)
    prefill = getattr(out, "prefill_stats", None)
    if prefill is not None:
        iteration_stats.prompt_token_stats.update_from_output(prefill)


class Delivered(list):  # type: ignore[type-arg]
    """The new token ids of an output whose tokens the library sent itself
    (vllm_outputs.py), an output otherwise plain."""

    __slots__ = ()


class DeliveredExtra(list):  # type: ignore[type-arg]
    """The same, of an output with events or prefill statistics, which vLLM's
    own way keeps in its books."""

    __slots__ = ()


#: What the short way takes from vLLM (``_unlike`` checks it on the running vLLM;
#: the ``RequestOutput`` it does not make has no other effect for a plain
#: output: it would pop prompt logprobs, which routed requests do not ask for,
#: and clear sampling-mask chunks, which plain outputs do not bring):
#: the parameters of ``OutputProcessor.process_outputs`` and of the statistics it
#: records each output with, the fields of ``EngineCoreOutput`` it knows (every
#: other one must be unset; ``num_nans_in_logits`` goes to the statistics, and
#: ``trace_headers`` is read when a request finishes), and what vLLM's own
#: ``process_outputs`` does with a plain output, which the short way repeats.
_PROCESS_OUTPUTS = ["engine_core_outputs", "engine_core_timestamp", "iteration_stats", "weight_version"]
_UPDATE_STATS = ["req_state", "engine_core_output", "engine_core_timestamp", "iteration_stats"]
_KNOWN_FIELDS = {"request_id", "new_token_ids", "num_nans_in_logits", "trace_headers", *_UNSET}
_VLLMS_STEPS = (
    "self._update_stats_from_output(",
    "req_state.is_prefilling = False",
    "req_state.track_weight_version(weight_version)",
    "req_state.detokenizer.update(",
    "req_state.queue.put(request_output)",
)


def _unlike(processor: Any) -> str:
    """How ``processor`` (vLLM's ``OutputProcessor``) differs from what the short
    way was written against; "" where it does not."""
    import inspect

    from vllm.v1.engine import EngineCoreOutput  # type: ignore[import-not-found]
    from vllm.v1.engine.output_processor import OutputProcessor, RequestState  # type: ignore[import-not-found]

    if type(processor) is not OutputProcessor:
        return f"its output processor is a {type(processor).__name__}"
    if list(inspect.signature(processor.process_outputs).parameters) != _PROCESS_OUTPUTS:
        return f"process_outputs{inspect.signature(processor.process_outputs)}"
    if list(inspect.signature(processor._update_stats_from_output).parameters) != _UPDATE_STATS:
        return f"_update_stats_from_output{inspect.signature(processor._update_stats_from_output)}"
    unknown = set(getattr(EngineCoreOutput, "__struct_fields__", ())) - _KNOWN_FIELDS
    if unknown or "new_token_ids" not in getattr(EngineCoreOutput, "__struct_fields__", ()):
        return f"EngineCoreOutput has fields {sorted(unknown)} the short way does not know"
    if not isinstance(processor.request_states, dict) or not callable(getattr(RequestState, "track_weight_version", None)):
        return "its request states differ"
    source = inspect.getsource(OutputProcessor.process_outputs)
    missing = [step for step in _VLLMS_STEPS if step not in source]
    if missing:
        return f"its process_outputs no longer does {missing}"
    # The counting detokenizer finds no stop string (so vLLM would trim nothing).
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer  # type: ignore[import-not-found]

    if "return None" not in inspect.getsource(IncrementalDetokenizer.update):
        return "its counting detokenizer's update may return a stop string"
    return ""
