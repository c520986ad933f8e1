"""The mock engine's scheduler: vLLM V1's, reduced to what a mock needs (see mocker.py).

Each step (``Scheduler.schedule``) first schedules the running requests in the
order they were admitted, each its next tokens (one in decode, the next chunk of
a prompt being prefilled), then admits waiting requests first come first served
while the step's token budget (``max_num_batched_tokens``), the ``max_num_seqs``
places and the free KV blocks allow. A prompt larger than what is left of the
budget is prefilled in chunks over several steps. KV blocks are allocated as
tokens are scheduled; when a running request needs a block and none is free,
the request admitted last is preempted: it frees all its blocks and goes back to
the front of the waiting queue, to be recomputed (its prompt and the tokens it
generated) when it is admitted again, and no request is admitted in that step
(vllm/v1/core/sched/scheduler.py, FCFS policy, without prefix caching, spec
decode or ``long_prefill_token_threshold``).

A request's KV is computed up to ``computed`` tokens; after a step its whole
sequence is computed when ``computed`` reaches ``base + len(out)``, and then it
samples its next token (the engine does that, in mocker.py).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Deque, List, Optional, Tuple

__all__ = ["EngineStats", "SchedRequest", "Scheduler"]

# Where a request is (SchedRequest.where).
NOWHERE, WAITING, RUNNING = 0, 1, 2


@dataclass
class EngineStats:
    """What a worker reports. Gauges: ``running_requests`` (requests holding
    engine resources, waiting or not), ``num_requests_running`` and
    ``num_requests_waiting`` (as vLLM's gauges of those names: admitted, and
    waiting or preempted), ``kv_blocks_in_use`` and ``kv_cache_usage`` (the
    fraction of ``num_kv_blocks`` in use, as vLLM's ``kv_cache_usage_perc``),
    ``peak_running_requests`` (the most ``running_requests`` ever were).
    The rest are cumulative."""

    running_requests: int = 0
    peak_running_requests: int = 0
    kv_blocks_in_use: int = 0
    requests_total: int = 0
    aborts_requested: int = 0
    aborts_confirmed: int = 0
    kv_blocks_freed_by_aborts: int = 0
    prefill_aborts: int = 0
    steps: int = 0  # engine steps run
    num_requests_running: int = 0
    num_requests_waiting: int = 0
    num_preemptions: int = 0  # vLLM's counter of that name
    num_kv_blocks: int = 0  # the pool's size

    @property
    def kv_cache_usage(self) -> float:
        return self.kv_blocks_in_use / self.num_kv_blocks if self.num_kv_blocks else 0.0


class SchedRequest:
    """What the scheduler knows of a request."""

    __slots__ = ("base", "out", "computed", "blocks", "remote_prefill", "where")

    def __init__(self, base: int, remote_prefill: bool) -> None:
        #: Tokens of the prompt (at least 1: an empty prompt is computed as one token).
        self.base = base
        #: Tokens generated.
        self.out: List[int] = []
        #: Tokens whose KV is computed (including those a step being run computes).
        self.computed = 0
        #: KV blocks held.
        self.blocks = 0
        #: Its prompt's KV comes from a prefill engine: when admitted it needs
        #: the prompt's blocks and computes only its last token.
        self.remote_prefill = remote_prefill
        self.where = NOWHERE


#: One step's work: each request with the tokens scheduled for it.
Batch = List[Tuple[SchedRequest, int]]


class Scheduler:
    """Waiting and running queues, the token budget and the KV block pool."""

    def __init__(self, stats: EngineStats, max_num_batched_tokens: int, max_num_seqs: Optional[int], num_kv_blocks: int,
                 block_size: int) -> None:
        if max_num_batched_tokens < 1 or num_kv_blocks < 1 or block_size < 1:
            raise ValueError("max_num_batched_tokens, num_kv_blocks and block_size must be positive")
        if max_num_seqs is not None and max_num_seqs > max_num_batched_tokens:
            # As vLLM's SchedulerConfig: each sequence in a step needs a token of the budget.
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must be at least max_num_seqs ({max_num_seqs})")
        self.stats = stats
        stats.num_kv_blocks = num_kv_blocks
        self.budget = max_num_batched_tokens
        #: Places for sequences: max_num_seqs, else the budget (a sequence a token).
        self.seats = max_num_seqs if max_num_seqs is not None else max_num_batched_tokens
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        #: The most tokens a sequence can hold: the whole pool.
        self.capacity = num_kv_blocks * block_size
        self.running: List[SchedRequest] = []  # in the order admitted
        self.waiting: Deque[SchedRequest] = collections.deque()
        # A request left (finished or aborted): its queue holds it until the next step.
        self._stale_running = self._stale_waiting = False

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def add(self, req: SchedRequest) -> None:
        req.where = WAITING
        self.waiting.append(req)
        self.stats.num_requests_waiting += 1

    def remove(self, req: SchedRequest) -> int:
        """Take ``req`` out (it finished or was aborted): its blocks are free
        at once. Returns the blocks freed."""
        stats = self.stats
        if req.where == RUNNING:
            stats.num_requests_running -= 1
            self._stale_running = True
        elif req.where == WAITING:
            stats.num_requests_waiting -= 1
            self._stale_waiting = True
        else:
            return 0
        req.where = NOWHERE
        freed = req.blocks
        req.blocks = 0
        stats.kv_blocks_in_use -= freed
        return freed

    def _preempt(self, req: SchedRequest) -> int:
        """Back to the front of the waiting queue, its blocks freed, to be recomputed."""
        freed = req.blocks
        req.blocks = 0
        req.computed = 0
        req.remote_prefill = False  # its KV is gone: recomputed here
        req.where = WAITING
        self.waiting.appendleft(req)
        self.stats.num_preemptions += 1
        return freed

    def schedule(self) -> Tuple[Batch, int]:
        """The next step: (requests and their tokens, tokens in all)."""
        if self._stale_running:
            self.running = [r for r in self.running if r.where == RUNNING]
            self._stale_running = False
        if self._stale_waiting:
            self.waiting = collections.deque(r for r in self.waiting if r.where == WAITING)
            self._stale_waiting = False
        budget = self.budget
        bs = self.block_size
        free = self.num_kv_blocks - self.stats.kv_blocks_in_use
        running = self.running
        batch: Batch = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            computed = r.computed
            n = r.base + len(r.out) - computed
            if n > budget:
                n = budget
            end = computed + n
            need = 0
            if end > r.blocks * bs:
                need = -(-end // bs) - r.blocks
                if need > free:
                    preempted = True
                    victim = None
                    while need > free and victim is not r:
                        victim = running.pop()  # the request admitted last
                        free += self._preempt(victim)
                    if victim is r:
                        break  # it preempted itself: nothing more runs this step
            r.blocks += need
            free -= need
            batch.append((r, n))
            budget -= n
            i += 1
        if not preempted:
            budget, free = self._admit(batch, budget, free)
        stats = self.stats
        stats.kv_blocks_in_use = self.num_kv_blocks - free
        stats.num_requests_running = len(running)
        stats.num_requests_waiting = len(self.waiting)
        return batch, self.budget - budget

    def _admit(self, batch: Batch, budget: int, free: int) -> Tuple[int, int]:
        """Admit waiting requests, first come first served, while the budget,
        the places and the free blocks allow; (budget, free) left."""
        waiting, running = self.waiting, self.running
        while waiting and budget > 0 and len(running) < self.seats:
            r = waiting[0]
            if r.remote_prefill:
                computed, n = r.base - 1, 1  # the prompt's KV arrives; its last token is computed here
            else:
                computed = 0
                n = min(r.base + len(r.out), budget)
            need = self.blocks_for(computed + n)
            if need > free:
                break  # first come first served: the rest wait too
            waiting.popleft()
            r.where = RUNNING
            r.computed = computed
            r.blocks = need
            free -= need
            running.append(r)
            batch.append((r, n))
            budget -= n
        return budget, free
