"""vLLM-style worker handlers that abort the engine the moment a request is cancelled.

Three handlers over any engine with the interface of vLLM's ``AsyncLLM``
(``generate(prompt, sampling_params, request_id)`` and ``abort(request_id)``):
the real ``vllm.AsyncLLM`` when vLLM is installed, ``dynamo_ctx.mocker.MockAsyncLLM``
everywhere.

- ``AggregatedHandler``: prefill and decode in one engine.
- ``PrefillHandler``: prefill only, as vLLM's disaggregated prefill runs: ``max_tokens=1``
  and ``SamplingParams.extra_args={"kv_transfer_params": {"do_remote_decode": True}}``; its
  last item carries the engine's own ``RequestOutput.kv_transfer_params``.
- ``DecodeHandler``: calls a prefill worker first (with ``context=``, so cancelling the
  decode request cancels the prefill, before the first token too), then runs the same
  request in its engine with the prefill's parameters in
  ``extra_args={"kv_transfer_params": ...}`` (the engine's KV connector pulls the KV cache
  they name). The prefill's token is not used: the decode engine produces every token, as in
  vLLM's own disaggregated serving.

The engine is called exactly as vLLM's ``AsyncLLM`` defines (``make test-vllm`` checks every
call against vLLM's signatures). Outputs are asked as deltas (``RequestOutputKind.DELTA``)
and without text (``detokenize=False``): the frontend detokenizes, as Dynamo's does.

Engine death (``EngineDeadError``, or an engine whose ``errored`` is true) is for the worker:
a handler whose ``engine_dead`` hook is set calls it and waits for the worker to hand its
stream over (the worker shuts its runtime down, which ends every stream without its final
marker, so migration continues it elsewhere); without the hook the error is raised.

Each request has a monitor on its context that aborts the engine as soon as it is
stopped or killed: it runs in the event loop's callback that learns of it, before
any task wakes, and even while the engine is busy (a per-token check alone would
wait for the next token, and prefill yields none). The abort runs at once up to its
first suspension (all of it with the mock), is idempotent and is also done on the
way out, so it happens whichever of the monitor and the dispatcher's cancellation
runs first.

Served through a runtime, a request's outputs are pushed: the handler admits it with the
engine's ``add_request`` and replaces ``put`` on the collector that returns (vLLM's
``RequestOutputCollector``, the mock's alike), so the engine's output callback makes each
output an item and hands it to the caller (``serving.item_sink``) in the engine's own
step, and no task wakes per request per step; the handler's task waits for the end. A
handler called directly (no runtime) reads ``generate``'s stream; the items are the same.

Requests are Dynamo-style token requests: ``{"token_ids": [...], "stop_conditions":
{"max_tokens": N, "stop_token_ids": [...], "ignore_eos": bool}, "sampling_options": {"seed",
"temperature", "top_p", "presence_penalty", "frequency_penalty"}}`` (a top-level
``max_tokens`` is accepted too; everything but token_ids is optional: a request that
sets no max_tokens, or null, may fill the rest of the context). The stop token ids
and sampling options go to the engine's SamplingParams. Each response item is
``{"token_ids": [new tokens], "finish_reason": ...}``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import secrets
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple

from .. import _trace
from .._aio import eager_task, on_stopped
from ..context import Context
from ..serving import item_sink, pushes_items
from .vllm_lean import LeanOutputs
from .metrics import OUTCOMES, WorkerMetrics  # noqa: F401 - WorkerMetrics's home is metrics.py; importable here as before

logger = logging.getLogger("dynamo_ctx.backends.vllm")

__all__ = [
    "WorkerMetrics", "BaseWorkerHandler", "AggregatedHandler", "PrefillHandler", "DecodeHandler", "sampling_params_for", "request_options",
    "is_engine_dead", "PREFILL_TRANSFER_PARAMS",
]

#: What a disaggregated prefill asks its engine for (vLLM's KV connectors read it
#: from ``SamplingParams.extra_args["kv_transfer_params"]``).
PREFILL_TRANSFER_PARAMS: Dict[str, Any] = {"do_remote_decode": True}


def is_engine_dead(error: BaseException, engine: Any) -> bool:
    """Whether ``error`` means the whole engine failed, not one request: vLLM's
    ``EngineDeadError`` (the mock raises one of that name too), or any error
    while the engine reports itself ``errored``."""
    if type(error).__name__ == "EngineDeadError":
        return True
    try:
        return bool(getattr(engine, "errored", False))
    except Exception:  # noqa: BLE001 - a property that fails says nothing
        return False


@functools.lru_cache(maxsize=None)
def sampling_option_names() -> Tuple[str, ...]:
    """The sampling options of a token request that go to the engine's
    SamplingParams: every engine's (go/modelcard's BaseParams) and those an
    engine may honour (EngineParams; the frontend sends them only to engines
    whose card lists them). Read from the library on first use: the engine
    may fork, so the library loads after it."""
    from .._lib import native

    lib = native()
    return tuple(lib.BASE_PARAMS.split(",")) + tuple(lib.ENGINE_PARAMS.split(","))


def request_options(request: Dict[str, Any]) -> Dict[str, Any]:
    """The engine options a token request carries (SamplingParams keyword arguments besides max_tokens)."""
    sc = request.get("stop_conditions") or {}
    so = request.get("sampling_options") or {}
    opts: Dict[str, Any] = {k: so[k] for k in sampling_option_names() if so.get(k) is not None}
    if "logit_bias" in opts:  # JSON keys are strings; SamplingParams wants token ids
        opts["logit_bias"] = {int(k): float(v) for k, v in opts["logit_bias"].items()}
    if sc.get("stop_token_ids"):
        opts["stop_token_ids"] = [int(t) for t in sc["stop_token_ids"]]
    if sc.get("ignore_eos") is not None:
        opts["ignore_eos"] = bool(sc["ignore_eos"])
    return opts


#: What makes an engine's request key (``_engine_stream``) unguessable: 128
#: random bits drawn once per process (logged only at DEBUG), followed by a
#: serial number that makes each key unique (random bits per request would
#: cost a system call each).
_ENGINE_KEY = secrets.token_hex(16) + "-"
_engine_serial = itertools.count(1)


#: A log probability below this (vLLM's -inf for an impossible token) is written
#: as this: JSON has no infinity (OpenAI writes the same floor).
LOGPROB_FLOOR = -9999.0


def _candidates(step: Any) -> List[Dict[str, Any]]:
    """The engine's candidates at one position, in its order (the sampled token first,
    then by rank), each ``{"token_id", "logprob", "rank"}``; none for a position the
    engine has no logprobs for."""
    if not step:
        return []
    return [{"token_id": int(t), "logprob": max(p.logprob, LOGPROB_FLOOR), "rank": p.rank} for t, p in step.items()]


def add_logprobs(item: Dict[str, Any], token_ids: List[int], steps: Any) -> None:
    """Put the engine's logprobs of ``token_ids`` into ``item`` (go/tokens' Item):
    ``log_probs``, each token's log probability, and ``top_logprobs``, the engine's
    candidates at its position (``_candidates``)."""
    log_probs: List[float] = []
    tops: List[List[Dict[str, Any]]] = []
    for tid, step in zip(token_ids, steps):
        chosen = step.get(tid) if step else None
        if chosen is None:
            break  # the engine has none for this token: the frontend writes what came
        log_probs.append(max(chosen.logprob, LOGPROB_FLOOR))
        tops.append(_candidates(step))
    item["log_probs"] = log_probs
    item["top_logprobs"] = tops


def add_prompt_logprobs(item: Dict[str, Any], prompt_ids: List[int], steps: Any) -> None:
    """Put the engine's logprobs of the prompt's tokens into ``item``
    (``prompt_log_probs``, ``prompt_top_logprobs``, as ``add_logprobs``); a position the
    engine has none for (the first) is null, with no candidates."""
    log_probs: List[Optional[float]] = []
    tops: List[List[Dict[str, Any]]] = []
    for tid, step in zip(prompt_ids, steps):
        chosen = step.get(tid) if step else None
        log_probs.append(None if chosen is None else max(chosen.logprob, LOGPROB_FLOOR))
        tops.append(_candidates(step))
    item["prompt_log_probs"] = log_probs
    item["prompt_top_logprobs"] = tops


def sampling_params_for(engine: Any, max_tokens: int, options: Optional[Dict[str, Any]] = None) -> Any:
    """Sampling parameters for ``engine``: vLLM's class when it is vLLM, the mock's otherwise.

    ``options`` are more keyword arguments (see ``request_options``). vLLM stops at
    EOS unless ``ignore_eos`` is given true. vLLM's and the mock's outputs carry
    only the new tokens (``RequestOutputKind.DELTA``), as Dynamo's vLLM handler
    asks, unless ``options`` names another ``output_kind``.
    """
    maker = _sampling_maker(type(engine))  # type: ignore[arg-type]  # classes hash
    return maker(max_tokens, dict(options or {}))


@functools.lru_cache(maxsize=None)
def _sampling_maker(engine_type: type) -> Callable[[int, Dict[str, Any]], Any]:
    """What makes the sampling parameters of an engine of ``engine_type``
    (``sampling_params_for``): the classes are looked up once per engine
    type, not per request."""
    if engine_type.__module__.startswith("vllm"):  # only then: a failed import per request is slow
        try:
            from vllm import SamplingParams  # type: ignore[import-not-found]
            from vllm.sampling_params import RequestOutputKind as VllmOutputKind  # type: ignore[import-not-found]

            def vllm_params(max_tokens: int, opts: Dict[str, Any]) -> Any:
                opts.setdefault("output_kind", VllmOutputKind.DELTA)
                if isinstance(opts.get("structured_outputs"), dict):
                    from vllm.sampling_params import StructuredOutputsParams  # type: ignore[import-not-found]

                    opts["structured_outputs"] = StructuredOutputsParams(**opts["structured_outputs"])
                return SamplingParams(max_tokens=max_tokens, **opts)

            return vllm_params
        except ImportError:
            pass
    from .mocker import MockAsyncLLM, RequestOutputKind
    from .mocker import SamplingParams as MockSamplingParams

    # Another engine may not know output kinds: it gets the default.
    delta = issubclass(engine_type, MockAsyncLLM)

    def mock_params(max_tokens: int, opts: Dict[str, Any]) -> Any:
        if delta:
            opts.setdefault("output_kind", RequestOutputKind.DELTA)
        return MockSamplingParams(max_tokens=max_tokens, **opts)

    return mock_params


def _spent() -> Dict[str, Any]:
    """The one item that answers a request with nothing left to generate
    (max_tokens 0, e.g. a migration's retry after every token arrived): its
    budget is spent, as "length" says, and no engine is asked (vLLM's
    ``SamplingParams`` refuses 0)."""
    return {"token_ids": [], "finish_reason": "length"}


#: The tokens a request that sets no max_tokens may generate when the
#: context length is unknown (vLLM's ``SamplingParams`` default).
DEFAULT_MAX_TOKENS = 16


def _max_tokens(request: Dict[str, Any], context_length: Optional[int]) -> int:
    """A request's max_tokens: ``stop_conditions.max_tokens``, else the top
    level's; where neither is given (or both are null) the rest of the
    context (``context_length`` less the prompt, at least 1), as Dynamo's
    vLLM handler does; ``DEFAULT_MAX_TOKENS`` without a context length.
    go/tokens' ``ParseRequest`` reads the same keys in the same order."""
    sc = request.get("stop_conditions")
    for n in (sc.get("max_tokens") if isinstance(sc, dict) else None, request.get("max_tokens")):
        if n is not None:
            if type(n) is not int or n < 0:  # as go/tokens reads it: not 10.0, "10" or true
                raise ValueError(f"max_tokens must be an integer of 0 or more, not {n!r}")
            return n
    if context_length is None:
        return DEFAULT_MAX_TOKENS
    return max(1, context_length - len(request.get("token_ids") or ()))


class BaseWorkerHandler:
    """Shared machinery: abort monitor, idempotent abort with confirmation, metrics."""

    label = ""  # "" or "Prefill ", as in "New Prefill Request ID"

    def __init__(self, engine: Any, model: str = "mock-model", metrics: Optional[WorkerMetrics] = None) -> None:
        self.engine = engine
        self.model = model
        self.metrics = metrics or WorkerMetrics(model)
        self._aborting: Dict[str, "asyncio.Future[None]"] = {}
        #: Called with (request_id, kv_blocks_freed) after each confirmed abort.
        self.abort_listeners: List[Callable[[str, int], None]] = []
        #: Called with the error when the engine dies under a request (see the
        #: module's docstring); None: the error is raised to the caller.
        self.engine_dead: Optional[Callable[[BaseException], None]] = None
        self._engine_died = False  # the engine died under a request of this handler
        #: The context length: what a request that sets no max_tokens may fill
        #: (``_max_tokens``). The engine's own (vLLM's ``model_config``) unless
        #: set; the worker's command sets its model's.
        self.max_model_len: Optional[int] = getattr(getattr(engine, "model_config", None), "max_model_len", None)

    def _start_abort(self, engine_id: str, request_id: str, context: Context) -> "asyncio.Future[None]":
        """Abort ``engine_id`` in the engine once, and count the confirmation:
        the abort runs now, up to its first suspension (all of it with the
        mock), and the returned future ends with it.

        The monitor and the handler's ``finally`` may both call it; they share
        one future, so nothing can cut the abort short or repeat it.
        ``request_id`` (the context's id) is for logs; the context's reason
        is what the abort is counted and logged under.
        """
        fut = self._aborting.get(engine_id)
        if fut is None:
            fut = self._aborting[engine_id] = eager_task(self._do_abort(engine_id, request_id, context.reason() or "kill", context))
        return fut

    async def _abort(self, engine_id: str, request_id: str, context: Context) -> None:
        await asyncio.shield(self._start_abort(engine_id, request_id, context))

    def _monitor(self, engine_id: str, request_id: str, context: Context) -> None:
        """The context was stopped or killed: abort at once (this runs in the
        event loop's callback that learned it, before any task wakes)."""
        try:
            fut = self._start_abort(engine_id, request_id, context)
            # Awaited by the handler's finally; a failure is reported there.
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        except Exception:  # noqa: BLE001 - the callback must not raise; the handler's finally retries
            logger.exception("aborting request %s failed", request_id)

    async def _do_abort(self, engine_id: str, request_id: str, reason: str, context: Optional[Context] = None) -> None:
        self.metrics.cancellation(reason)
        # vLLM's abort returns once the engine dropped the request; the mock
        # also returns how many KV blocks that freed.
        try:
            freed = await self.engine.abort(engine_id)
        except Exception as e:
            if is_engine_dead(e, self.engine):
                # Nothing left to abort, and nothing to confirm: the worker
                # is handing its streams over (engine_dead).
                logger.debug("abort of %sRequest ID %s: the engine is dead (%s)", self.label, request_id, e)
                return
            raise
        freed = freed if isinstance(freed, int) else 0
        self.metrics.abort_confirmed(reason, freed)
        if context is not None:
            _trace.context_event(context, _trace.KV_BLOCKS_FREED, {"count": freed})
        extra = {"reason": reason, "request_id": request_id}
        logger.info("Aborted %sRequest ID: %s (reason: %s)", self.label, request_id, reason, extra=extra)
        for listener in list(self.abort_listeners):
            listener(request_id, freed)

    def _count_outcome(self, context: Context, error: Optional[BaseException], dead: bool) -> None:
        """Count a request's one outcome (OUTCOMES) as it ends: ``error`` is
        what it raised (None: nothing), ``dead`` whether its engine died."""
        if dead:
            outcome = "failed"
        elif context.is_killed():
            outcome = "deadline" if context.reason() == "deadline" else "cancelled"
        elif context.is_stopped():
            outcome = "stopped"
        elif error is None:
            outcome = "completed"
        elif isinstance(error, (GeneratorExit, asyncio.CancelledError)):
            outcome = "cancelled"  # its consumer left it
        else:
            outcome = "failed"
        self.metrics.outcome(outcome)

    async def _engine_stream(
        self,
        context: Context,
        request_id: str,
        prompt: Any,
        max_tokens: int,
        options: Optional[Dict[str, Any]] = None,
        counted: bool = True,
    ) -> AsyncIterator[Dict[str, Any]]:
        """Run the engine for one request under an abort monitor; yield delta items.

        ``counted``: the request and its outcome are counted here (a caller
        that counts them itself, around more than this, says False).

        ``request_id`` is the context's id, a correlation id that any client
        may choose (two requests may share it): it is what the logs show. The
        engine's own key is that id plus this process's 128 random bits and
        a serial number (``_ENGINE_KEY``), so that no client can abort, or
        block, another's request in the engine.
        """
        if counted:
            self.metrics.requests_total += 1
        error: Optional[BaseException] = None
        dead = False
        engine_id = f"{request_id}-{_ENGINE_KEY}{next(_engine_serial):x}"
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("New %sRequest ID: %s", self.label, request_id)
            logger.debug("%sRequest ID %s runs in the engine as %s", self.label, request_id, engine_id)
        opts = dict(options or {})
        opts.setdefault("detokenize", False)  # the frontend makes the text
        try:
            params = sampling_params_for(self.engine, max_tokens, opts)
        except Exception as e:  # the engine refuses the request: one outcome, as for any
            if counted:
                self._count_outcome(context, e, False)
            raise
        # Outputs carry the new tokens only (DELTA), or every token so far.
        items = _Items(getattr(getattr(params, "output_kind", None), "name", "CUMULATIVE") != "DELTA")
        finished = False  # the engine gave its last output: nothing left to abort
        outputs: Any = None
        # Pushed: the engine's output callback hands each item over itself
        # (_Pushed); else this task reads the engine's stream.
        sink = item_sink() if max_tokens > 0 and _pushable(type(self.engine)) else None  # type: ignore[arg-type]  # classes hash
        pushed: Optional[_Pushed] = None
        reader: Any = None  # the library's reader of the engine's outputs, watching this request
        admitted = False  # add_request returned: the engine holds the request

        def on_stop() -> None:
            self._monitor(engine_id, request_id, context)
            if pushed is not None:
                pushed.end()  # as the stream's reader stops reading (below)

        stop_monitor = on_stopped(context, on_stop)
        # The engine's span, under the handler's (the library's: _trace).
        span = _trace.span_start(context, {"gen_ai.request.max_tokens": max_tokens, "dynamo_ctx.engine_request_id": engine_id})
        try:
            if sink is not None:
                if context.is_stopped():
                    return  # nothing started: nothing to abort
                pushed = _Pushed(items, sink, context, stop_monitor)
                lean = _lean_outputs(self.engine)
                # The library reads the engine's outputs (vllm_outputs.py): it may
                # send this request's plain tokens itself, from its first output
                # on, so it watches the request before the engine has it.
                served = getattr(sink, "request", None)
                reader = lean.go if lean is not None and served is not None else None
                if reader is not None:
                    reader.reserve(engine_id)
                collector = await self.engine.add_request(engine_id, _engine_input(self.engine, prompt, params, request_id), params)
                admitted = True
                if context.is_stopped():
                    # Stopped meanwhile: the monitor's abort may have come before the engine knew it.
                    await asyncio.shield(_abort_quietly(self.engine, engine_id))
                    return
                pushed.watch(collector)
                routed = None
                try:
                    routed = getattr(collector, "request_id", None) if lean is not None else None
                    if routed is not None and not lean.route(routed, pushed.tokens):  # type: ignore[union-attr]
                        routed = None
                    if routed is not None and reader is not None and reader.activate(engine_id, routed, served):
                        lean.deliver_to(routed, pushed)  # type: ignore[union-attr]
                        if logger.isEnabledFor(logging.DEBUG):
                            logger.debug("%sRequest ID %s: the library sends its plain tokens", self.label, request_id)
                    elif reader is not None:
                        reader.drop(engine_id)  # its outputs are all the worker's: none need wait for it
                        reader = None
                    await pushed.done
                finally:
                    # Nothing more goes to the request, by either way, once it
                    # ended here (also when it failed: the abort comes after).
                    if routed is not None:
                        lean.unroute(routed)  # type: ignore[union-attr]
                    if reader is not None:
                        reader.drop(engine_id)
                        reader = None  # dropped: the last finally has nothing to drop
                finished = pushed.finished
                return
            outputs = self.engine.generate(_engine_input(self.engine, prompt, params, request_id), params, engine_id)
            async for out in outputs:
                if finished:
                    continue  # the engine's stream is read to its end (see below), nothing more sent
                if context.is_stopped():
                    break  # the monitor aborts the engine
                item = items.item(out)
                if out.finished:
                    # Done in the engine: a stop from now on aborts nothing.
                    finished = True
                    stop_monitor()
                yield item
                # After its last output the engine's stream ends by itself:
                # closing it before that would make vLLM abort the request,
                # a message to its engine core for a request already done.
        except BaseException as e:
            error = e
            if pushed is not None:
                finished = pushed.finished
            if not isinstance(e, Exception) or self.engine_dead is None or context.is_stopped() or not is_engine_dead(e, self.engine):
                raise
            finished, dead = True, True  # nothing is left to abort in a dead engine
            self._engine_died = True
            self.engine_dead(e)
            # The worker ends this stream without its final marker (a
            # migratable end); until then, the caller sees nothing more.
            await context.killed()
        finally:
            stop_monitor()
            if counted:
                self._count_outcome(context, error, dead)
            try:
                if engine_id in self._aborting or (context.is_stopped() and not finished):
                    # Whichever ran first (the monitor, or the dispatcher cancelling
                    # this handler on kill), the engine is aborted exactly once.
                    await self._abort(engine_id, request_id, context)
                elif admitted and not finished:
                    # Its reader failed (an item it could not hand over): the
                    # engine's request ends too, as vLLM's generate ends it.
                    await asyncio.shield(_abort_quietly(self.engine, engine_id))
            finally:
                try:
                    # Close the engine's stream now, unless it ended: breaking out of
                    # async-for leaves an async generator suspended (holding the
                    # request) until GC.
                    aclose = getattr(outputs, "aclose", None)
                    if aclose is not None and getattr(outputs, "ag_frame", True) is not None:
                        await asyncio.shield(aclose())
                finally:
                    self._aborting.pop(engine_id, None)
                    if reader is not None:
                        reader.drop(engine_id)
                    if span:
                        usage = {"gen_ai.usage.output_tokens": items.produced,
                                 "gen_ai.response.finish_reasons": [items.finish] if items.finish else []}
                        _trace.span_end(span, usage, failed=error is not None and isinstance(error, Exception))


class _Items:
    """One request's engine outputs made into items (go/tokens' Item):
    ``{"token_ids": [new tokens], "finish_reason", "log_probs", ...}``."""

    __slots__ = ("cumulative", "seen", "prompt_sent", "produced", "finish")

    def __init__(self, cumulative: bool) -> None:
        self.cumulative = cumulative  # outputs carry every token so far, not the new ones (DELTA)
        self.seen = 0  # tokens of a cumulative output already sent
        self.prompt_sent = False  # the prompt's logprobs went out (the first item carries them)
        self.produced = 0
        self.finish: Optional[str] = None

    def item(self, out: Any) -> Dict[str, Any]:
        """The item of the engine's output ``out``."""
        o = out.outputs[0]
        steps = getattr(o, "logprobs", None)
        if self.cumulative:
            delta = list(o.token_ids[self.seen:])
            steps = steps[self.seen:] if steps is not None else None
            self.seen = len(o.token_ids)
        else:
            delta = list(o.token_ids)
        item: Dict[str, Any] = {"token_ids": delta}
        if steps is not None:
            add_logprobs(item, delta, steps)
        prompt_steps = getattr(out, "prompt_logprobs", None)
        if prompt_steps and not self.prompt_sent:
            self.prompt_sent = True
            add_prompt_logprobs(item, list(out.prompt_token_ids or []), prompt_steps)
        if o.finish_reason is not None:
            item["finish_reason"] = self.finish = o.finish_reason
        self.produced += len(delta)
        if out.finished:
            transfer = getattr(out, "kv_transfer_params", None)
            if transfer is not None:
                item["kv_transfer_params"] = transfer
        return item


class _Pushed:
    """A request whose engine outputs are handed over by the engine's output
    callback itself: its collector's ``put`` (vLLM's ``RequestOutputCollector``,
    the mock's alike) is replaced, so each output becomes an item in the
    engine's own step and no task wakes for it. ``done`` ends when the
    request does: its last output, a stop (``end``), or an error (the
    engine's, or an item that could not be handed over)."""

    __slots__ = ("items", "sink", "context", "stop_monitor", "done", "finished", "quiet")

    def __init__(self, items: _Items, sink: Callable[[Any], None], context: Context, stop_monitor: Callable[[], Any]) -> None:
        self.items = items
        self.sink = sink
        self.context = context
        self.stop_monitor = stop_monitor
        self.done: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        self.finished = False  # the engine gave its last output
        # Set while vLLM's output processor handles an output whose tokens the
        # library sent itself (vllm_lean's Quiet): its output is only counted.
        self.quiet = False

    def watch(self, collector: Any) -> None:
        """Take ``collector``'s outputs from now on, and any it already holds."""
        collector.put = self.put
        try:
            early = collector.get_nowait()
        except Exception as e:  # noqa: BLE001 - the error it held is the request's
            self.put(e)
            return
        if early is not None:
            self.put(early)

    def put(self, output: Any) -> None:
        """The engine's output callback: never raises into it (an error there
        would fail every request of the engine)."""
        try:
            self._put(output)
        except Exception as e:  # noqa: BLE001 - the request fails, not the engine's callback
            self._fail(e)

    def _put(self, output: Any) -> None:
        if self.done.done():
            return  # ended: the abort's last output, one after a failure, or the task was cancelled
        if isinstance(output, BaseException):
            self._fail(output)
            return
        if self.quiet:
            self.items.produced += len(output.outputs[0].token_ids)  # sent by the library (DELTA: routed)
            return
        if self.context.is_stopped():
            self.end()  # as a reader that stops reading; the monitor aborts the engine
            return
        item = self.items.item(output)
        if output.finished:
            # Done in the engine: a stop from now on aborts nothing.
            self.finished = True
            self.stop_monitor()
        self.sink(item)  # may deliver what the loop has pending: a kill cancels the task (and done)
        if self.finished:
            self.end()

    def tokens(self, ids: List[int]) -> None:
        """The engine's new tokens, and nothing else, by the short way around
        vLLM's output processor (vllm_lean.py): what ``put`` makes of an output
        that carries only these. Never raises into the engine's callback."""
        try:
            if self.done.done():
                return
            if self.context.is_stopped():
                self.end()
                return
            self.items.produced += len(ids)
            self.sink({"token_ids": ids})
        except Exception as e:  # noqa: BLE001 - the request fails, not the engine's callback
            self._fail(e)

    def count(self, ids: List[int]) -> None:
        """Count ``ids``, which the library sent itself (vllm_lean's Quiet)."""
        self.items.produced += len(ids)

    def end(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(error)


def _engine_input(engine: Any, prompt: Dict[str, Any], params: Any, request_id: str) -> Any:
    """What vLLM's ``AsyncLLM`` is handed for ``prompt`` (``{"prompt_token_ids":
    [...]}``) and ``params``: the engine input its renderer makes of the prompt,
    as vLLM's own servers hand it over, made here on the event loop.

    Given a rendered input, ``add_request`` runs vLLM's checks of the request
    (``InputProcessor.process_inputs``) on the loop; given the raw prompt it
    runs them, and the render, on its renderer's thread pool (two thread
    hand-overs per request) and warns that raw prompts are deprecated. For a
    prompt of token ids and ordinary parameters all of it is plain Python (a
    few dict and list operations, and a pass over the prompt's ids), which
    held the interpreter's lock on the pool's thread too, so the loop does
    it. The raw prompt still goes, and
    vLLM's thread pool does the work, where it is more: structured output
    (vLLM compiles the grammar to check it, up to seconds for a large schema)
    and bad words (tokenized), and a renderer whose defaults would decode the
    prompt's text. It goes too to any other engine (the mock takes both forms)
    and to a vLLM whose renderer is not the one this was written against
    (``_renders``). The prompt is parsed for the model as vLLM parses a raw
    one (``parse_model_prompt``: an encoder-decoder model's too), and rendered
    with the parameters it would use; the renderer's errors (a prompt it
    refuses) are the request's, as they would be inside ``add_request``."""
    renderer = getattr(engine, "renderer", None) if _renders(type(engine)) else None  # type: ignore[arg-type]  # classes hash
    if renderer is None:
        return prompt
    why = ""
    if getattr(params, "structured_outputs", None) is not None:
        why = "structured output"
    elif getattr(params, "bad_words", None):
        why = "bad words"
    else:
        tok_params = renderer.default_cmpl_tok_params.with_kwargs()  # as process_inputs makes them
        if tok_params.needs_detokenization:
            why = "its text is wanted"
    if why:
        logger.debug("Request %s goes to vLLM as a raw prompt (%s): checked on vLLM's thread pool", request_id, why)
        return prompt
    (engine_input,) = renderer.render_cmpl([_vllm_parse_model_prompt()(engine.model_config, prompt)], tok_params)
    return engine_input


@functools.lru_cache(maxsize=None)
def _vllm_parse_model_prompt() -> Callable[[Any, Any], Any]:
    from vllm.renderers.inputs.preprocess import parse_model_prompt  # type: ignore[import-not-found]

    return parse_model_prompt  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=None)
def _renders(engine_type: type) -> bool:
    """Whether ``_engine_input`` renders prompts for engines of ``engine_type``:
    vLLM's ``AsyncLLM``, whose ``add_request`` takes a rendered input as it is
    (an ``EngineInput``: a dict with a "type"), and whose renderer has
    ``render_cmpl`` and default parameters that say whether they need the
    prompt's text."""
    if not _is_vllm_async_llm(engine_type):  # type: ignore[arg-type]  # classes hash
        return False
    try:
        import inspect

        from vllm.renderers.base import BaseRenderer  # type: ignore[import-not-found]
        from vllm.renderers.params import TokenizeParams  # type: ignore[import-not-found]

        _vllm_parse_model_prompt()
        if not (callable(getattr(BaseRenderer, "render_cmpl", None)) and hasattr(BaseRenderer, "default_cmpl_tok_params")
                and callable(getattr(TokenizeParams, "with_kwargs", None))):
            why = "its renderer differs"
        elif 'isinstance(prompt, dict) and "type" in prompt' not in inspect.getsource(engine_type.add_request):  # type: ignore[attr-defined]
            why = "its add_request takes no rendered input"
        elif "needs_detokenization" not in getattr(TokenizeParams, "__dataclass_fields__", {}):
            why = "its tokenize parameters differ"
        else:
            why = ""
    except Exception as e:  # noqa: BLE001 - another vLLM: the raw prompt, as before
        why = repr(e)
    if why:
        logger.info("vLLM renders the worker's prompts itself, on its thread pool: %s", why)
        return False
    logger.info("The worker's prompts go to vLLM rendered (its renderer's render_cmpl, on the event loop)")
    return True


def _lean_outputs(engine: Any) -> Optional[LeanOutputs]:
    """The short way of ``engine``'s plain outputs (vllm_lean.py); None for an
    engine that is not vLLM's ``AsyncLLM``, or a vLLM without what the short way
    relies on."""
    return LeanOutputs.of(engine) if _is_vllm_async_llm(type(engine)) else None  # type: ignore[arg-type]  # classes hash


@functools.lru_cache(maxsize=None)
def _is_vllm_async_llm(engine_type: type) -> bool:
    return any(c.__module__ == "vllm.v1.engine.async_llm" and c.__name__ == "AsyncLLM" for c in engine_type.__mro__)


@functools.lru_cache(maxsize=None)
def _pushable(engine_type: type) -> bool:
    """Whether outputs of an engine of ``engine_type`` can be pushed: vLLM's
    ``AsyncLLM`` (its ``add_request`` returns a ``RequestOutputCollector``
    whose ``put`` its output handler calls) or the mock, which has the same."""
    from .mocker import MockAsyncLLM

    if issubclass(engine_type, MockAsyncLLM):
        return True
    return _is_vllm_async_llm(engine_type)  # type: ignore[arg-type]  # classes hash


async def _abort_quietly(engine: Any, engine_id: str) -> None:
    """Abort ``engine_id`` without counting it (a failure, not a cancellation);
    a dead engine has nothing to abort."""
    try:
        await engine.abort(engine_id)
    except Exception as e:  # noqa: BLE001 - nothing more to do for it
        logger.debug("abort of %s after its failure: %r", engine_id, e)


class AggregatedHandler(BaseWorkerHandler):
    """Prefill and decode in one engine."""

    @pushes_items
    async def generate(self, request: Dict[str, Any], context: Context) -> AsyncIterator[Dict[str, Any]]:
        prompt = {"prompt_token_ids": list(request.get("token_ids", []))}
        error: Optional[BaseException] = None
        try:
            max_tokens = _max_tokens(request, self.max_model_len)
            options = request_options(request)
        except Exception as e:  # a request no engine could take: counted as one that failed
            self.metrics.requests_total += 1
            self._count_outcome(context, e, False)
            raise
        if max_tokens == 0:
            self.metrics.requests_total += 1
            try:
                yield _spent()
            except BaseException as e:
                error = e
                raise
            finally:
                self._count_outcome(context, error, False)
            return
        async for item in self._engine_stream(context, context.id(), prompt, max_tokens, options=options):
            yield item


class PrefillHandler(BaseWorkerHandler):
    """Prefill only: one token, and the parameters a decode engine needs to take over
    (the engine's ``RequestOutput.kv_transfer_params``, on the last item)."""

    label = "Prefill "

    @pushes_items
    async def generate(self, request: Dict[str, Any], context: Context) -> AsyncIterator[Dict[str, Any]]:
        prompt = {"prompt_token_ids": list(request.get("token_ids", []))}
        options = request_options(request)
        options["extra_args"] = {"kv_transfer_params": dict(PREFILL_TRANSFER_PARAMS)}
        async for item in self._engine_stream(context, context.id(), prompt, 1, options=options):
            yield item


class DecodeHandler(BaseWorkerHandler):
    """Calls a prefill worker with ``context=`` (so a decode cancel aborts prefill too), then
    runs the request in its own engine with the prefill's KV transfer parameters."""

    def __init__(self, engine: Any, prefill_client: Any, model: str = "mock-model", metrics: Optional[WorkerMetrics] = None) -> None:
        super().__init__(engine, model, metrics)
        self.prefill_client = prefill_client

    @pushes_items
    async def generate(self, request: Dict[str, Any], context: Context) -> AsyncIterator[Dict[str, Any]]:
        # Counted here, around the prefill call and the engine's stream: a
        # prefill that fails fails this request too.
        self.metrics.requests_total += 1
        error: Optional[BaseException] = None
        engine_ran = False
        try:
            max_tokens = _max_tokens(request, self.max_model_len)
            if max_tokens == 0:
                yield _spent()  # no prefill either
                return
            token_ids = list(request.get("token_ids", []))
            prefill_request = dict(request, stop_conditions=dict(request.get("stop_conditions") or {}, max_tokens=1))
            prefill_request.pop("max_tokens", None)
            answered = False
            transfer: Optional[Dict[str, Any]] = None
            stream = await self.prefill_client.generate(prefill_request, context=context)
            async for item in stream:
                answered = True
                data = item.data()
                if isinstance(data, dict) and data.get("kv_transfer_params") is not None:
                    transfer = data["kv_transfer_params"]
            if context.is_stopped() or not answered:
                return
            options = request_options(request)
            if transfer is not None:
                options["extra_args"] = {"kv_transfer_params": transfer}
            prompt = {"prompt_token_ids": token_ids}
            engine_ran = True
            async for item in self._engine_stream(context, context.id(), prompt, max_tokens, options=options, counted=False):
                yield item
        except BaseException as e:
            error = e
            raise
        finally:
            self._count_outcome(context, error, engine_ran and self._engine_died)
