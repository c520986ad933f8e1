"""A mock LLM engine with the interface of vLLM's ``AsyncLLM`` (docs/design.md, section 8).

It runs like a real engine: one step loop for all running requests. Each
step decodes one token for every request in decode and prefills a chunk of
the waiting prompts (at most ``prefill_chunk_tokens`` tokens a step, first
come first served); a step lasts ``decode_time_per_token`` when anything
decodes, plus ``prefill_time_per_token`` for each prompt token it prefills.
So a lone request takes as long as before, and many requests cost one timer
a step, not one per request per token. It tracks running requests and the
KV-cache blocks they hold and counts aborts, so a test can check that an
abort really freed everything. An abort takes effect at once: the request
leaves the batch, its resources are freed and its ``generate`` ends, during
a long prefill step as well as between tokens; a step left with no request
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
skips its prefill. Every request's parameters are recorded
(``kv_transfer_params_received``). ``die(reason)`` makes the engine dead as
vLLM's is when its core process fails: running and later requests raise
``EngineDeadError``, and ``errored`` is true.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import math
import sys
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Deque, Dict, List, Optional, Tuple, Union

__all__ = [
    "RequestOutputKind", "SamplingParams", "CompletionOutput", "RequestOutput", "MockEngineArgs", "MockAsyncLLM", "EngineStats",
    "EngineDeadError",
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


@dataclass
class MockEngineArgs:
    """Engine configuration. Times are seconds."""

    prefill_time_per_token: float = 0.0002
    decode_time_per_token: float = 0.002  # the time of one decode step, for the whole batch
    prefill_chunk_tokens: int = 512  # prompt tokens prefilled in one step, at most
    block_size: int = 16
    num_kv_blocks: int = 16384
    vocab_size: int = 32000
    seed: int = 1000
    #: The ids the mock produces (None: those below vocab_size).
    token_ids: Optional[List[int]] = None
    #: The engine dies (``die``) after this many steps: a rehearsal of engine
    #: death for fault tests (None: never).
    die_after_steps: Optional[int] = None
    #: Sequences scheduled at once, as vLLM's ``max_num_seqs``: the rest wait,
    #: first come first served, for one to end (None: no limit).
    max_num_seqs: Optional[int] = None


@dataclass
class EngineStats:
    """Counters a worker reports (all cumulative except the first two)."""

    running_requests: int = 0
    kv_blocks_in_use: int = 0
    requests_total: int = 0
    aborts_requested: int = 0
    aborts_confirmed: int = 0
    kv_blocks_freed_by_aborts: int = 0
    prefill_aborts: int = 0
    steps: int = 0  # engine steps run (one decode token per request in decode, a prefill chunk)


@dataclass
class _Request:
    request_id: str
    prompt: List[int]
    params: SamplingParams
    blocks: int = 0
    phase: str = "prefill"  # prefill (waiting or in progress), decode, done
    aborted: bool = False
    prefilled: int = 0  # prompt tokens prefilled so far
    out: List[int] = field(default_factory=list)  # tokens generated
    outputs: Deque[RequestOutput] = field(default_factory=collections.deque)  # not yet taken by generate
    waiter: "Optional[asyncio.Future[None]]" = None  # generate waiting for an output
    remote_decode: bool = False  # a disaggregated prefill: its last output carries kv_transfer_params
    scheduled: bool = False  # holds one of the engine's max_num_seqs places (else it waits)
    error: Optional[BaseException] = None  # the engine died under it


class MockAsyncLLM:
    """``generate(prompt, sampling_params, request_id)`` and ``abort(request_id)`` like vLLM's AsyncLLM."""

    def __init__(self, args: Optional[MockEngineArgs] = None, **overrides: Any) -> None:
        self.args = args or MockEngineArgs()
        for k, v in overrides.items():
            setattr(self.args, k, v)
        self.stats = EngineStats()
        self._running: Dict[str, _Request] = {}
        # request id -> KV blocks its abort freed (the most recent ones only)
        self.confirmed_aborts: "collections.OrderedDict[str, int]" = collections.OrderedDict()
        # Aborts that happened without abort() (a consumer cancelled): the KV
        # blocks freed, reported by the next abort() of that id.
        self._unreported: "collections.OrderedDict[str, int]" = collections.OrderedDict()
        # The step loop's queues: prompts to prefill (first come first served)
        # and requests in decode. Requests that ended are dropped lazily.
        self._prefilling: Deque[_Request] = collections.deque()
        self._decoding: List[_Request] = []
        self._scheduled = 0  # requests holding a place (max_num_seqs)
        self._stepper: "Optional[asyncio.Task[None]]" = None
        self._step_wake: "Optional[asyncio.Future[None]]" = None  # the step's sleep, cut short when it empties
        #: This engine's id in the KV transfer parameters it returns.
        self.engine_id = f"mock-{id(self):x}"
        #: request id -> the kv_transfer_params its SamplingParams.extra_args
        #: brought (the most recent requests only).
        self.kv_transfer_params_received: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
        self.dead_error: Optional[EngineDeadError] = None
        vocab = self.args.token_ids
        self._vocab: Optional[List[int]] = list(vocab) if vocab else None

    # -------------------------------------------------------------- introspection

    def running_request_ids(self) -> List[str]:
        """Ids of the requests currently holding engine resources."""
        return list(self._running)

    def waiting_request_ids(self) -> List[str]:
        """Ids of the running requests that wait for a place (max_num_seqs)."""
        return [rid for rid, r in self._running.items() if not r.scheduled]

    def phase(self, request_id: str) -> Optional[str]:
        """"prefill", "decode", or None when the request is not running."""
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
            req.error = self.dead_error
            self._release(req, False)
            self._wake(req)


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

    def _blocks_for(self, n_tokens: int) -> int:
        return math.ceil(n_tokens / self.args.block_size) if n_tokens else 0

    async def generate(
        self,
        prompt: Union[str, List[int], Dict[str, Any]],
        sampling_params: Union[SamplingParams, Dict[str, Any], None],
        request_id: str,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Prefill the prompt, then decode up to ``max_tokens`` tokens, yielding
        outputs (cumulative unless ``output_kind`` says otherwise).

        KV transfer (``sampling_params.extra_args["kv_transfer_params"]``):
        ``do_remote_decode`` makes the last output carry the parameters a
        decode engine needs; ``do_remote_prefill`` (a decode whose prompt was
        prefilled elsewhere) makes the prefill cost nothing here.
        """
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
        remote_prefill = isinstance(kv_transfer_params, dict) and bool(kv_transfer_params.get("do_remote_prefill"))
        tokens = self._prompt_tokens(prompt)
        req = _Request(request_id, tokens, params)
        req.remote_decode = isinstance(kv_transfer_params, dict) and bool(kv_transfer_params.get("do_remote_decode"))
        req.blocks = self._blocks_for(len(tokens))
        if self.stats.kv_blocks_in_use + req.blocks > self.args.num_kv_blocks:
            raise RuntimeError("out of KV cache blocks")
        self._running[request_id] = req
        self.stats.kv_blocks_in_use += req.blocks
        self.stats.running_requests = len(self._running)
        self.stats.requests_total += 1
        if remote_prefill:
            req.prefilled = len(tokens)
            if self._seats() > 0 and not self._prefilling:
                self._schedule(req)
                req.phase = "decode"
                self._decoding.append(req)
            else:
                self._prefilling.append(req)  # waits for a place; its prefill costs nothing
        else:
            self._prefilling.append(req)
        self._start_stepper()
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
        """Steps while any request runs: each decodes a token for every request
        in decode and prefills a chunk of the waiting prompts."""
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            while self._prefilling and self._prefilling[0].phase != "prefill":
                self._prefilling.popleft()  # ended while waiting
            self._decoding = [r for r in self._decoding if r.phase == "decode"]
            if not self._prefilling and not self._decoding:
                return
            decoding = list(self._decoding)
            chunks: List[Tuple[_Request, int]] = []
            budget = max(1, self.args.prefill_chunk_tokens)
            for r in self._prefilling:
                if budget <= 0:
                    break
                if r.phase != "prefill":
                    continue
                if not r.scheduled:
                    if self._seats() <= 0:
                        break  # first come first served: the rest wait for a place
                    self._schedule(r)
                n = min(budget, len(r.prompt) - r.prefilled)
                chunks.append((r, n))
                budget -= n
            step = (self.args.decode_time_per_token if decoding else 0.0) + self.args.prefill_time_per_token * sum(n for _, n in chunks)
            # Steps run back to back at the engine's pace, as a GPU's do while
            # the host processes the last step's outputs: the next step is due
            # ``step`` after the last one was due, or now if the host is behind.
            deadline = max(deadline + step, loop.time())
            await self._sleep_until(deadline)
            if self.dead_error is not None:
                return
            self.stats.steps += 1
            if self.args.die_after_steps is not None and self.stats.steps >= self.args.die_after_steps:
                self.die(f"the mock engine died after {self.stats.steps} steps (die_after_steps)")
                return
            for r, n in chunks:
                if r.phase != "prefill":
                    continue  # aborted during the step
                r.prefilled += n
                if r.prefilled >= len(r.prompt):
                    r.phase = "decode"
                    self._decoding.append(r)
                    if r.params.max_tokens <= 0:
                        self._release(r, False)
                        self._wake(r)
            self._decode(decoding)

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

    def _decode(self, batch: List[_Request]) -> None:
        """One decode step of every request in ``batch`` still in decode: its
        next token, as an output. (Per token, so written for speed: what the
        mock costs is what a benchmark of the stack measures.)"""
        args = self.args
        seed0, block_size = args.seed, args.block_size
        vocab = self._vocab
        size = len(vocab) if vocab is not None else args.vocab_size
        stats = self.stats
        delta, final_only = RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY
        wake = self._wake
        for req in batch:
            if req.phase != "decode":
                continue
            params = req.params
            out = req.out
            n = len(req.prompt) + len(out)  # the sequence so far
            seed = params.seed
            token = ((seed0 if seed is None else seed) + n) % size
            if vocab is not None:
                token = vocab[token]
            out.append(token)
            if n >= req.blocks * block_size:  # the new token needs another block
                need = self._blocks_for(n + 1)
                stats.kv_blocks_in_use += need - req.blocks
                req.blocks = need
            finish: Optional[str] = None
            if len(out) >= params.max_tokens:
                finish = "length"
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
            req.outputs.append(out_)
            wake(req)

    def _transfer_params(self, req: _Request) -> Dict[str, Any]:
        """What a disaggregated prefill returns for its decode engine, in the
        shape of vLLM's NIXL connector's."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": list(range(self._blocks_for(len(req.prompt)))),
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
        """Count an abort of a running request once; False if it was not running."""
        if self._running.get(req.request_id) is not req or req.aborted:
            return False
        self.stats.aborts_requested += 1
        if req.phase == "prefill":
            self.stats.prefill_aborts += 1
        req.aborted = True
        return True

    def _seats(self) -> int:
        """Places free for another sequence (max_num_seqs)."""
        limit = self.args.max_num_seqs
        return limit - self._scheduled if limit is not None else 1

    def _schedule(self, req: _Request) -> None:
        req.scheduled = True
        self._scheduled += 1

    def _release(self, req: _Request, aborted: bool, reported: bool = False) -> None:
        if self._running.pop(req.request_id, None) is None:
            return
        if req.scheduled:
            req.scheduled = False
            self._scheduled -= 1
        freed = req.blocks
        self.stats.kv_blocks_in_use -= freed
        self.stats.running_requests = len(self._running)
        req.phase = "done"  # the step loop drops it
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

    async def abort(self, request_id: Union[str, List[str]]) -> int:
        """Abort requests: their ``generate`` ends at once and their resources are freed.

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
            freed += req.blocks
            self._release(req, True, reported=True)
            tokens: List[int] = [] if req.params.output_kind is RequestOutputKind.DELTA else list(req.out)
            req.outputs.append(RequestOutput(rid, req.prompt, [CompletionOutput(0, tokens, finish_reason="abort")], finished=True))
            self._wake(req)
        return freed


def _resolve(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)
