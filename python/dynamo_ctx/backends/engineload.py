"""The engine's own load, as a worker publishes it with its load reports.

An engine's scheduler knows what the worker's count of requests does not:
the requests it holds back (waiting for KV blocks, or preempted) and how full
its KV cache is. ``LoadSink`` takes those two figures from the engine, after
each of its steps, and hands them to the served endpoint
(``Endpoint.set_engine_load``) when they change; the frontends then route new
requests away from an instance whose engine has requests waiting or a fuller
KV cache (docs/design.md, section 10).

Two sources: the mock engine reports into a sink itself (``MockAsyncLLM.
load_sink``, after each step, with one comparison a step); vLLM's ``AsyncLLM``
through a stat logger (``vllm_stat_logger``), which vLLM calls with its
``SchedulerStats`` after each step: ``num_waiting_reqs`` +
``num_skipped_waiting_reqs`` (vLLM's ``vllm:num_requests_waiting``) and
``kv_cache_usage`` (``vllm:kv_cache_usage_perc``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional, Tuple

__all__ = ["LoadSink", "vllm_stat_logger"]

logger = logging.getLogger(__name__)

#: Where the figures go: ``Endpoint.set_engine_load(waiting, kv_usage)``.
Target = Callable[[Optional[int], Optional[float]], None]


class LoadSink:
    """The engine's latest figures, handed to ``target`` when they change.

    The engine may report before the endpoint serves (vLLM's first steps):
    the figures are kept, and ``attach`` hands over the latest. With several
    engines (vLLM's data parallel ranks, by engine index) the figures are
    their sum of waiting requests and their highest KV usage.
    """

    def __init__(self) -> None:
        self._target: Optional[Target] = None
        self._by_engine: Dict[int, Tuple[int, float]] = {}
        self._sent: Optional[Tuple[int, float]] = None

    def attach(self, target: Optional[Target]) -> None:
        """Send the figures to ``target`` from now on (None: to nobody)."""
        self._target = target
        self._sent = None
        self._send()

    def report(self, waiting: int, kv_usage: float, engine: int = 0) -> None:
        """Record one engine's figures; the caller calls it when they changed."""
        self._by_engine[engine] = (waiting, kv_usage)
        self._send()

    def _send(self) -> None:
        if self._target is None or not self._by_engine:
            return
        if len(self._by_engine) == 1:  # one engine (no data parallel): its figures
            (now,) = self._by_engine.values()
        else:
            figures = self._by_engine.values()
            now = (sum(w for w, _ in figures), max(kv for _, kv in figures))
        if now == self._sent:
            return
        self._sent = now
        try:
            self._target(now[0], now[1])
        except Exception as e:  # noqa: BLE001 - the engine's step must go on; the next change tries again
            self._sent = None
            logger.debug("the engine's load was not published: %s: %s", type(e).__name__, e)


def vllm_stat_logger(sink: LoadSink) -> Any:
    """A vLLM stat logger class (pass it in ``AsyncLLM``'s ``stat_loggers``)
    that reports each step's waiting requests and KV cache usage into
    ``sink`` when they change: one comparison a step otherwise."""
    from vllm.v1.metrics.loggers import StatLoggerBase  # type: ignore[import-not-found]

    class EngineLoadLogger(StatLoggerBase):  # type: ignore[misc]
        """Reports the scheduler's waiting requests and KV cache usage."""

        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index
            self.last: Tuple[int, float] = (-1, -1.0)

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            if scheduler_stats is None:
                return
            now = (scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs, scheduler_stats.kv_cache_usage)
            if now != self.last:
                self.last = now
                sink.report(now[0], now[1], engine_idx)

        def log_engine_initialized(self) -> None:
            pass

    return EngineLoadLogger
