"""A mock LLM engine with the interface of vLLM's ``AsyncLLM`` (docs/design.md, section 8).

It runs like vLLM's V1 engine: one step loop, continuous batching, chunked
prefill and a paged KV cache (the scheduler is mock_scheduler.py). Each step
first schedules the running requests in the order they were admitted (one
token for each in decode, the next chunk for each whose prompt is being
prefilled), then admits waiting requests, first come first served, while the
step's ``max_num_batched_tokens``, the ``max_num_seqs`` places and the free
KV blocks (``num_kv_blocks`` of ``block_size`` tokens) allow; a prompt larger
than what is left of the budget is prefilled over several steps. A step that
completes a sequence's KV (the last chunk of its prompt, or a decode token)
makes its next token. Blocks are taken as tokens are scheduled; when a
running request needs one and none is free, the request admitted last is
preempted as vLLM's are: its blocks are freed, it goes back to the front of
the waiting queue, and when admitted again its prompt and the tokens it made
are computed again (it outputs no token twice, and its tokens are those it
would have made anyway). Requests wait rather than fail for want of blocks;
a prompt larger than the whole cache is refused (ValueError), and a sequence
that would outgrow it ends with "length".

A step lasts ``decode_time_per_token + decode_time_per_seq * (seqs - 1) +
prefill_time_per_token * (tokens - seqs)`` (see MockEngineArgs): a linear
model of vLLM's step time in the tokens and sequences it runs, whose
constants python/benchmarks/calibrate_mock.py fits to vLLM's ``AsyncLLM``
(the time between tokens of 1, 16 and 64 decode streams, and of steps that
prefill prompts of 64, 256 and 480 tokens). Many requests cost one timer a
step, not one per request per token. The engine tracks the requests it
holds, the KV blocks they hold and counts aborts and preemptions
(``EngineStats``), so a test can check that an abort really freed
everything. An abort takes effect at once: the request leaves the batch or
the waiting queue, its blocks are freed and its ``generate`` ends, during a
long prefill step as well as between tokens; a step left with no request
ends early.

Tokens are deterministic: the token after a sequence of length ``n`` is
``vocabulary[(seed + n) % len(vocabulary)]``, so a stream that is migrated to
another engine continues exactly where it stopped. The vocabulary is
``MockEngineArgs.token_ids`` when given (a worker serving a model directory
gives its tokenizer's text tokens, so the output is the model's text), else
the ids below ``vocab_size``. ``seed`` is the request's
``SamplingParams.seed`` when it gives one, else the engine's
(``MockEngineArgs.seed``). A token in ``stop_token_ids`` ends the request
with finish reason "stop" (the token is part of the output, as in vLLM).
``temperature`` and ``top_p`` are accepted and have no effect: the mock does
not sample.

Its signatures are vLLM's (``generate(prompt, sampling_params, request_id)``,
``abort(request_id)``, ``SamplingParams`` fields by vLLM's names), so a call the
real engine would refuse fails against the mock too; ``make test-vllm`` checks
them against vLLM itself. KV transfer works as vLLM's does: a request whose
``SamplingParams.extra_args["kv_transfer_params"]`` asks ``do_remote_decode``
(a disaggregated prefill) ends with ``RequestOutput.kv_transfer_params`` (the
engine id, block ids, host and port a decode engine pulls from), and a request
that brings such parameters with ``do_remote_prefill`` (a disaggregated decode)
skips its prefill: admitted, it takes the prompt's blocks and computes only its
last token (after a preemption it computes everything, as vLLM's does). Every
request's parameters are recorded (``kv_transfer_params_received``).
``die(reason)`` makes the engine dead as vLLM's is when its core process
fails: running and later requests raise ``EngineDeadError``, and ``errored``
is true.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import os
import sys
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Deque, Dict, List, Optional, Tuple, Union, cast

from .engineload import LoadSink
from .mock_scheduler import WAITING, Batch, EngineStats, SchedRequest, Scheduler

__all__ = [
    "DEFAULT_MAX_NUM_BATCHED_TOKENS", "RequestOutputKind", "SamplingParams", "CompletionOutput", "RequestOutput",
    "MockEngineArgs", "MockAsyncLLM", "EngineStats", "EngineDeadError", "RequestOutputCollector",
]


class EngineDeadError(Exception):
    """The engine died (vLLM's exception of that name): every request running
    on it failed, and it takes no more."""


#: Outputs are made per token: with slots where dataclasses have them (3.10+).
_SLOTS: Dict[str, Any] = {"slots": True} if sys.version_info >= (3, 10) else {}


class RequestOutputKind(enum.Enum):
    """What each output of ``generate`` carries, as vLLM's enum of that name:
    every token so far (the default), only the tokens new since the last
    output, or one output when the request finishes."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    """A subset of vLLM's SamplingParams, by its names: the mock honours the
    token counts, seed, stop token ids, output kind and ``extra_args``
    (``kv_transfer_params``); the rest is accepted and has no effect."""

    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: Optional[int] = None
    stop_token_ids: List[int] = field(default_factory=list)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    detokenize: bool = True  # the mock makes no text either way
    skip_special_tokens: bool = True
    extra_args: Optional[Dict[str, Any]] = None


@dataclass(**_SLOTS)
class CompletionOutput:
    """One completion of a request; ``token_ids`` are every token so far
    (vLLM's default), or only the new ones with ``RequestOutputKind.DELTA``."""

    index: int
    token_ids: List[int]
    text: str = ""
    finish_reason: Optional[str] = None


@dataclass(**_SLOTS)
class RequestOutput:
    """What ``generate`` yields, shaped like vLLM's RequestOutput."""

    request_id: str
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool = False
    kv_transfer_params: Optional[Dict[str, Any]] = None


#: The step's token budget when MockEngineArgs gives none (see there).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


@dataclass
class MockEngineArgs:
    """Engine configuration. Times are seconds.

    A step that runs ``seqs`` sequences and ``tokens`` tokens lasts
    ``decode_time_per_token + decode_time_per_seq * (seqs - 1) +
    prefill_time_per_token * (tokens - seqs)``: a step that decodes one
    sequence takes ``decode_time_per_token``, each further sequence adds
    ``decode_time_per_seq`` and each further token (of a prompt)
    ``prefill_time_per_token``. That is ``a + b * tokens + c * seqs``, the
    linear model python/benchmarks/calibrate_mock.py fits to vLLM's steps.

    Calibration, 2026-12-05: ``flock /tmp/vllm-cpu.lock .venv-vllm-cpu/bin/python
    python/benchmarks/calibrate_mock.py --model /tmp/calib-model`` (vLLM 0.32's
    AsyncLLM on 2 CPU cores shared with other work, the tiny Llama of
    python/benchmarks/gpu/make_tiny_llama.py, max_num_batched_tokens 2048),
    medians of three runs (ranges in parentheses). Steps measured: 1 decode
    stream 2.49 ms, 16 streams 4.49 ms, 64 streams 8.09 ms; a prefill of 64,
    256, 480 tokens beside one decode 4.22, 7.63, 12.59 ms (the time to the
    first token of a lone prompt is 3 to 6 ms more than its step: the
    request's way in and out, not modelled). Fit: ``decode_time_per_token
    0.00275`` (2.62 to 3.64 ms), ``decode_time_per_seq 7.5e-05`` (73 to 104
    us), ``prefill_time_per_token 2.0e-05`` (18 to 20 us), which is
    ``--decode-time-per-token 0.00275 --decode-time-per-seq 7.5e-05
    --prefill-time-per-token 2e-05`` for the worker.

    The defaults are those figures, so that a mock worker started without
    timing flags steps like that engine: 64 prompts arriving together get
    their first tokens in one step of about 10 ms, not one after another.
    Tests and benchmarks that need another scale say so with the flags.
    """

    prefill_time_per_token: float = 2.0e-05
    decode_time_per_token: float = 0.00275  # a step that decodes one sequence
    decode_time_per_seq: float = 7.5e-05  # each further sequence in a step
    #: Tokens scheduled in one step, at most (vLLM's name). None: vLLM's
    #: default on a CPU for its API server (``vllm serve``), per
    #: vllm/engine/arg_utils.py: DEFAULT_MAX_NUM_BATCHED_TOKENS (2048; 4096
    #: for the offline ``LLM`` class), or ``max_num_seqs`` if that is larger.
    max_num_batched_tokens: Optional[int] = None
    block_size: int = 16
    #: The KV cache: blocks of ``block_size`` tokens. A prompt longer than
    #: the whole cache is refused; a sequence that would outgrow it ends
    #: with finish reason "length" (the cache is the mock's max_model_len).
    num_kv_blocks: int = 16384
    vocab_size: int = 32000
    seed: int = 1000
    #: The ids the mock produces (None: those below vocab_size).
    token_ids: Optional[List[int]] = None
    #: The engine dies (``die``) after this many steps: a rehearsal of engine
    #: death for fault tests (None: never).
    die_after_steps: Optional[int] = None
    #: Sequences running at once, as vLLM's ``max_num_seqs``: the rest wait,
    #: first come first served, for one to end (None: as many as
    #: ``max_num_batched_tokens``, which must be at least this).
    max_num_seqs: Optional[int] = None


class RequestOutputCollector:
    """One request's outputs on their way from the engine to its reader, in
    the shape of vLLM's class of this name: the engine calls ``put`` with each
    output (or with the error that ends the request), and ``generate`` takes
    them. ``add_request`` returns it; a reader that replaces ``put`` on it
    gets each output in the engine's own step, as vLLM's collector allows."""

    def __init__(self, req: "_Request") -> None:
        self.request_id = req.request_id
        self._req = req

    def put(self, output: Union["RequestOutput", BaseException]) -> None:
        """Keep ``output`` for ``generate`` and wake it."""
        req = self._req
        if isinstance(output, BaseException):
            req.error = output
        else:
            req.outputs.append(output)
        MockAsyncLLM._wake(req)

    def get_nowait(self) -> Optional["RequestOutput"]:
        """The next output kept, or None; raises the error that ended the request."""
        req = self._req
        if req.outputs:
            return req.outputs.popleft()
        if req.error is not None:
            raise req.error
        return None


class _Request(SchedRequest):
    __slots__ = ("request_id", "prompt", "plen", "params", "phase", "aborted", "outputs", "waiter", "remote_decode", "error", "queue")

    def __init__(self, request_id: str, prompt: List[int], params: SamplingParams, remote_prefill: bool, remote_decode: bool) -> None:
        super().__init__(max(1, len(prompt)), remote_prefill)
        self.request_id = request_id
        self.prompt = prompt
        self.plen = len(prompt)
        self.params = params
        self.phase = "prefill"  # prefill (waiting, or its prompt being computed), decode (it made a token), done
        self.aborted = False
        self.outputs: Deque[RequestOutput] = collections.deque()  # not yet taken by generate
        self.waiter: "Optional[asyncio.Future[None]]" = None  # generate waiting for an output
        self.remote_decode = remote_decode  # a disaggregated prefill: its last output carries kv_transfer_params
        self.error: Optional[BaseException] = None  # the engine died under it
        self.queue = RequestOutputCollector(self)  # where its outputs go (add_request)


class MockAsyncLLM:
    """``generate(prompt, sampling_params, request_id)``, ``add_request(request_id, prompt, params)``
    and ``abort(request_id)`` like vLLM's AsyncLLM."""

    #: The engine parameters beyond every engine's (go/modelcard's EngineParams) that
    #: the mock honours: its worker's model card lists them, and the frontend refuses
    #: the others (the mock's tokens are not sampled from a distribution that top_k,
    #: min_p, penalties or biases could shape).
    SUPPORTS = ("min_tokens",)

    def __init__(self, args: Optional[MockEngineArgs] = None, **overrides: Any) -> None:
        self.args = args or MockEngineArgs()
        for k, v in overrides.items():
            setattr(self.args, k, v)
        self.stats = EngineStats()
        a = self.args
        budget = a.max_num_batched_tokens
        if budget is None:
            budget = max(DEFAULT_MAX_NUM_BATCHED_TOKENS, a.max_num_seqs or 0)
        self._sched = Scheduler(self.stats, budget, a.max_num_seqs, a.num_kv_blocks, a.block_size)
        # request id -> the request, from generate until it ends (waiting or running)
        self._running: Dict[str, _Request] = {}
        # request id -> KV blocks its abort freed (the most recent ones only)
        self.confirmed_aborts: "collections.OrderedDict[str, int]" = collections.OrderedDict()
        # Aborts that happened without abort() (a consumer cancelled): the KV
        # blocks freed, reported by the next abort() of that id.
        self._unreported: "collections.OrderedDict[str, int]" = collections.OrderedDict()
        self._stepper: "Optional[asyncio.Task[None]]" = None
        self._step_wake: "Optional[asyncio.Future[None]]" = None  # the step's sleep, cut short when it empties
        #: This engine's id in the KV transfer parameters it returns.
        self.engine_id = f"mock-{id(self):x}"
        #: request id -> the kv_transfer_params its SamplingParams.extra_args
        #: brought (the most recent requests only).
        self.kv_transfer_params_received: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
        self.dead_error: Optional[EngineDeadError] = None
        #: Where the engine reports its waiting requests and KV cache usage
        #: after each step that changed them (engineload.py; None: nowhere).
        self.load_sink: Optional[LoadSink] = None
        vocab = self.args.token_ids
        self._vocab: Optional[List[int]] = list(vocab) if vocab else None
        # As vLLM's AsyncLLM handles a step's outputs: in chunks of this many,
        # letting the event loop run between them (its variable, its default).
        self._chunk = max(1, int(os.environ.get("VLLM_V1_OUTPUT_PROC_CHUNK_SIZE", "128")))

    # -------------------------------------------------------------- introspection

    def running_request_ids(self) -> List[str]:
        """Ids of the requests the engine holds (running or waiting)."""
        return list(self._running)

    def waiting_request_ids(self) -> List[str]:
        """Ids of the requests that wait to be scheduled (new, or preempted)."""
        return [rid for rid, r in self._running.items() if r.where == WAITING]

    def phase(self, request_id: str) -> Optional[str]:
        """"prefill" (waiting, or its prompt being computed), "decode" (it made
        a token; a preempted request stays in decode), or None when the
        engine does not hold the request."""
        r = self._running.get(request_id)
        return r.phase if r else None

    @property
    def errored(self) -> bool:
        """True once the engine is dead (as vLLM's ``AsyncLLM.errored``)."""
        return self.dead_error is not None

    @property
    def is_running(self) -> bool:
        return self.dead_error is None

    def die(self, reason: str = "the mock engine was made to die") -> None:
        """Kill the engine, as a dead engine core does: every running
        ``generate`` raises ``EngineDeadError``, and so does every later call."""
        if self.dead_error is not None:
            return
        self.dead_error = EngineDeadError(reason)
        for req in list(self._running.values()):
            self._release(req, False)
            req.queue.put(self.dead_error)

    def step_time(self, seqs: int, tokens: int) -> float:
        """How long a step of ``seqs`` sequences and ``tokens`` tokens lasts (see MockEngineArgs)."""
        a = self.args
        return a.decode_time_per_token + a.decode_time_per_seq * (seqs - 1) + a.prefill_time_per_token * (tokens - seqs)

    # -------------------------------------------------------------- engine API

    @staticmethod
    def _prompt_tokens(prompt: Union[str, List[int], Dict[str, Any]]) -> List[int]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt", "")
        if isinstance(prompt, str):
            return [ord(c) % 256 for c in prompt]  # one token per character: enough for a mock
        return list(prompt)  # type: ignore[arg-type]  # token ids (a dict was handled above)

    async def add_request(
        self,
        request_id: str,
        prompt: Union[str, List[int], Dict[str, Any]],
        params: Union[SamplingParams, Dict[str, Any], None],
    ) -> RequestOutputCollector:
        """Admit a request, as vLLM's ``AsyncLLM.add_request``: its outputs go
        to the returned collector's ``put`` (``generate`` reads them from it).

        KV transfer (``params.extra_args["kv_transfer_params"]``):
        ``do_remote_decode`` makes the last output carry the parameters a
        decode engine needs; ``do_remote_prefill`` (a disaggregated decode
        whose prompt was prefilled elsewhere) makes the prefill cost nothing
        here (it still needs the prompt's KV blocks).
        """
        return self._add(request_id, prompt, params).queue

    def _add(
        self, request_id: str, prompt: Union[str, List[int], Dict[str, Any]], sampling_params: Union[SamplingParams, Dict[str, Any], None]
    ) -> _Request:
        if self.dead_error is not None:
            raise self.dead_error
        if request_id in self._running:
            raise ValueError(f"request {request_id!r} is already running")
        params = sampling_params if isinstance(sampling_params, SamplingParams) else SamplingParams(**(sampling_params or {}))
        kv_transfer_params = (params.extra_args or {}).get("kv_transfer_params")
        if kv_transfer_params is not None:
            self.kv_transfer_params_received[request_id] = kv_transfer_params
            while len(self.kv_transfer_params_received) > 10000:
                self.kv_transfer_params_received.popitem(last=False)
        tokens = self._prompt_tokens(prompt)
        if len(tokens) > self._sched.capacity:
            a = self.args
            raise ValueError(
                f"request {request_id!r}: its prompt of {len(tokens)} tokens can never fit the KV cache "
                f"({a.num_kv_blocks} blocks of {a.block_size} tokens)"
            )
        kv: Dict[str, Any] = kv_transfer_params if isinstance(kv_transfer_params, dict) else {}
        req = _Request(request_id, tokens, params, bool(kv.get("do_remote_prefill")), bool(kv.get("do_remote_decode")))
        self._running[request_id] = req
        self.stats.running_requests = len(self._running)
        self.stats.peak_running_requests = max(self.stats.peak_running_requests, self.stats.running_requests)
        self.stats.requests_total += 1
        self._sched.add(req)
        self._start_stepper()
        return req

    async def generate(
        self,
        prompt: Union[str, List[int], Dict[str, Any]],
        sampling_params: Union[SamplingParams, Dict[str, Any], None],
        request_id: str,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Prefill the prompt, then decode up to ``max_tokens`` tokens, yielding
        outputs (cumulative unless ``output_kind`` says otherwise); the
        request is admitted as by ``add_request``."""
        req = self._add(request_id, prompt, sampling_params)
        loop = asyncio.get_running_loop()  # once: on Python < 3.12 each call is a getpid()
        try:
            while True:
                while not req.outputs:
                    if req.error is not None:
                        raise req.error
                    if req.phase == "done":
                        return  # ended without an output (max_tokens 0)
                    req.waiter = loop.create_future()
                    await req.waiter
                out = req.outputs.popleft()
                yield out
                if out.finished:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            # As vLLM's AsyncLLM.generate does: a consumer cancelled while it
            # awaits this stream, or one that drops it unfinished, aborts the
            # request (whichever of that and an explicit abort comes first).
            self._mark_aborted(req)
            raise
        finally:
            self._release(req, req.aborted)

    # -------------------------------------------------------------- the step loop

    def _start_stepper(self) -> None:
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.get_running_loop().create_task(self._step_loop())

    async def _step_loop(self) -> None:
        """Steps while the engine holds any request: each schedules its batch
        (mock_scheduler.Scheduler), lasts ``step_time`` of it, then makes a
        token for each sequence whose KV it completed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        schedule, stats, sink = self._sched.schedule, self.stats, self.load_sink
        waiting, blocks = -1, -1  # as last reported
        while self._running and self.dead_error is None:
            batch, tokens = schedule()
            if sink is not None and (stats.num_requests_waiting != waiting or stats.kv_blocks_in_use != blocks):
                waiting, blocks = stats.num_requests_waiting, stats.kv_blocks_in_use
                sink.report(waiting, stats.kv_cache_usage)
            if not batch:  # cannot happen: the first running request always fits (a bug, then: not a hang)
                self.die("the mock engine's scheduler could schedule no request")
                return
            # Steps run back to back at the engine's pace, as a GPU's do while
            # the host processes the last step's outputs: the next step is due
            # ``step`` after the last one was due, or now if the host is behind.
            deadline = max(deadline + self.step_time(len(batch), tokens), loop.time())
            await self._sleep_until(deadline)
            if self.dead_error is not None:
                return
            self.stats.steps += 1
            if self.args.die_after_steps is not None and self.stats.steps >= self.args.die_after_steps:
                self.die(f"the mock engine died after {self.stats.steps} steps (die_after_steps)")
                return
            # A step's outputs in chunks, the loop running between them (a
            # kill that arrives meanwhile aborts at once), as vLLM's
            # AsyncLLM output handler does (VLLM_V1_OUTPUT_PROC_CHUNK_SIZE).
            chunk = self._chunk
            for start in range(0, len(batch), chunk):
                if start:
                    await asyncio.sleep(0)
                    if self.dead_error is not None:
                        return
                self._complete(batch[start:start + chunk])
        if sink is not None:  # idle (or dead): what the last requests held is free
            sink.report(stats.num_requests_waiting, stats.kv_cache_usage)

    async def _sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline``, or until no request is left to step (an abort
        of the last one); always yields to the loop once."""
        loop = asyncio.get_running_loop()
        if deadline <= loop.time():
            await asyncio.sleep(0)
            return
        while self._running:
            fut: "asyncio.Future[None]" = loop.create_future()
            self._step_wake = fut
            timer = loop.call_at(deadline, _resolve, fut)
            try:
                await fut
            finally:
                timer.cancel()
                self._step_wake = None
            if loop.time() >= deadline:
                return

    def _complete(self, batch: Batch) -> None:
        """The end of a step: each request of ``batch`` still held has its
        scheduled tokens computed; one whose whole sequence is now computed
        makes its next token, as an output. (Per token, so written for speed:
        what the mock costs is what a benchmark of the stack measures.)"""
        args = self.args
        seed0 = args.seed
        vocab = self._vocab
        size = len(vocab) if vocab is not None else args.vocab_size
        capacity = self._sched.capacity
        delta, final_only = RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY
        wake = self._wake
        for req, n in cast(List[Tuple[_Request, int]], batch):
            if req.phase == "done":
                continue  # aborted during the step
            out = req.out
            computed = req.computed + n
            req.computed = computed
            if computed < req.base + len(out):
                continue  # a chunk of a prefill (or of a recompute)
            params = req.params
            if params.max_tokens <= 0:
                self._release(req, False)
                wake(req)
                continue
            seed = params.seed
            token = ((seed0 if seed is None else seed) + req.plen + len(out)) % size
            if vocab is not None:
                token = vocab[token]
            out.append(token)
            req.phase = "decode"
            finish: Optional[str] = None
            if len(out) >= params.max_tokens or req.base + len(out) > capacity:
                finish = "length"  # max_tokens, or the sequence would outgrow the KV cache
            if params.stop_token_ids and token in params.stop_token_ids and len(out) >= params.min_tokens:
                finish = "stop"
            if finish is not None:
                self._release(req, False)  # finished: resources go back before the last output
            kind = params.output_kind
            if kind is delta:
                ids = [token]
            elif kind is final_only and finish is None:
                continue
            else:
                ids = list(out)
            out_ = RequestOutput(req.request_id, req.prompt, [CompletionOutput(0, ids, "", finish)], finish is not None)
            if finish is not None and req.remote_decode:
                out_.kv_transfer_params = self._transfer_params(req)
            req.queue.put(out_)

    def _transfer_params(self, req: _Request) -> Dict[str, Any]:
        """What a disaggregated prefill returns for its decode engine, in the
        shape of vLLM's NIXL connector's."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": list(range(self._sched.blocks_for(len(req.prompt)))),
            "remote_host": "127.0.0.1",
            "remote_port": 0,
            "remote_request_id": req.request_id,
        }

    @staticmethod
    def _wake(req: _Request) -> None:
        w = req.waiter
        if w is not None and not w.done():
            w.set_result(None)
        req.waiter = None

    def _mark_aborted(self, req: _Request) -> bool:
        """Count an abort of a request the engine holds once; False if it does not hold it."""
        if self._running.get(req.request_id) is not req or req.aborted:
            return False
        self.stats.aborts_requested += 1
        if req.phase == "prefill":
            self.stats.prefill_aborts += 1
        req.aborted = True
        return True

    def _release(self, req: _Request, aborted: bool, reported: bool = False) -> int:
        """Drop a request the engine holds: its KV blocks are free at once. Returns the blocks freed."""
        if self._running.pop(req.request_id, None) is None:
            return 0
        freed = self._sched.remove(req)
        self.stats.running_requests = len(self._running)
        req.phase = "done"  # the step that ran it skips it
        if not self._running and self._step_wake is not None and not self._step_wake.done():
            self._step_wake.set_result(None)  # nothing left to step: end the step now
        if aborted:
            self.stats.aborts_confirmed += 1
            self.stats.kv_blocks_freed_by_aborts += freed
            self.confirmed_aborts[req.request_id] = freed
            while len(self.confirmed_aborts) > 10000:
                self.confirmed_aborts.popitem(last=False)
            if not reported:
                self._unreported[req.request_id] = freed
                while len(self._unreported) > 10000:
                    self._unreported.popitem(last=False)
        return freed

    async def abort(self, request_id: Union[str, List[str]]) -> int:
        """Abort requests: their ``generate`` ends at once and their resources
        are freed (waiting, preempted or running, during a step too).

        Returns the number of KV blocks freed (vLLM's returns None).
        """
        if self.dead_error is not None:
            raise self.dead_error
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        freed = 0
        for rid in ids:
            req = self._running.get(rid)
            if req is None:
                # Already aborted by its consumer's cancellation (see
                # generate): report what that abort freed, once.
                freed += self._unreported.pop(rid, 0)
                continue
            if not self._mark_aborted(req):
                continue
            # Like a real engine, the abort frees the request's resources
            # whether or not anyone is still iterating its generator, and its
            # generate ends with an "abort" output.
            freed += self._release(req, True, reported=True)
            tokens: List[int] = [] if req.params.output_kind is RequestOutputKind.DELTA else list(req.out)
            req.queue.put(RequestOutput(rid, req.prompt, [CompletionOutput(0, tokens, finish_reason="abort")], finished=True))
        return freed


def _resolve(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)
