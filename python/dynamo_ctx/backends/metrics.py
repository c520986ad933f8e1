"""What a worker counts (``WorkerMetrics``), as Prometheus metric families.

Every family is present from the start, each of its known label values at 0
(Prometheus practice: a dashboard or an alert then sees 0, not "no data"):
the model's label is the worker's from construction on, the reasons are the
library's (``_native.REASON_NAMES``, the names Go gives the contexts'
reasons), the outcomes are ``OUTCOMES``. The reasons are read when the
families are collected: making a ``WorkerMetrics`` does not load the library
(a worker makes its metrics before its engine, which may fork, and loads the
library after it).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from .._lib import native

__all__ = ["WorkerMetrics", "OUTCOMES", "reasons"]

#: How a worker's request ends, each exactly once (``dynamo_ctx_worker_outcomes_total``):
#: the engine finished it; it was stopped (the caller's stop_generating, or the handler's
#: own); the caller killed it (disconnect, kill, shutdown, a lost caller: ``cancelled``) or
#: its deadline passed; the handler or the engine failed; it was refused (``rejected``).
OUTCOMES = ("completed", "stopped", "cancelled", "deadline", "failed", "rejected")


def reasons() -> Tuple[str, ...]:
    """The reasons a context can be cancelled with, as the library names them
    (``client_disconnected``, ``deadline``, ...): the reason label's values."""
    return tuple(name for name in native().REASON_NAMES if name)


class WorkerMetrics:
    """What a worker counts, exposed through prometheus_client.

    The handlers bump the counters (plain attributes); ``collect`` reads them
    and the engine's ``stats`` when Prometheus scrapes, so a scrape sees one
    consistent moment and counting costs nothing. ``registry(engine)`` is a
    ``CollectorRegistry`` holding them; ``render(engine)`` its text exposition;
    ``exposition(engine)`` the worker's whole ``/metrics``. The cancellations
    and confirmed aborts are also counted by reason (the context's, e.g.
    ``client_disconnected``, ``deadline``), and every request's one outcome
    (``OUTCOMES``); every reason and outcome is exported from the start, at 0.
    """

    def __init__(self, model: str) -> None:
        self.model = model
        self.requests_total = 0
        self.cancellations_received_total = 0
        self.aborts_confirmed_total = 0
        self.abort_freed_kv_blocks_total = 0
        #: reason -> count, for the three above (the reasons counted so far;
        #: ``collect`` adds the others, at 0)
        self.cancellations_by_reason: Dict[str, int] = {}
        self.aborts_by_reason: Dict[str, int] = {}
        self.freed_by_reason: Dict[str, int] = {}
        #: outcome -> count
        self.outcomes: Dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        #: The requests the worker's endpoint refused as busy (at its
        #: capacity), read at each scrape (``Endpoint.busy_refusals``, once
        #: the endpoint serves).
        self.busy_refusals: Callable[[], int] = lambda: 0
        #: The output tokens the library sent to their callers itself, read
        #: from vLLM's engine core (backends/vllm_outputs.py), read at each
        #: scrape once the library reads them.
        self.library_sent_tokens: Callable[[], int] = lambda: 0
        #: The aborts the library sent vLLM's engine core itself, on its
        #: requests' stops (backends/vllm_outputs.py), read at each scrape.
        self.library_aborts: Callable[[], int] = lambda: 0

    def cancellation(self, reason: str) -> None:
        """Count a request whose context was stopped or killed for ``reason``."""
        self.cancellations_received_total += 1
        self.cancellations_by_reason[reason] = self.cancellations_by_reason.get(reason, 0) + 1

    def abort_confirmed(self, reason: str, freed: int) -> None:
        """Count an engine abort that returned, and the KV blocks it freed."""
        self.aborts_confirmed_total += 1
        self.abort_freed_kv_blocks_total += freed
        self.aborts_by_reason[reason] = self.aborts_by_reason.get(reason, 0) + 1
        self.freed_by_reason[reason] = self.freed_by_reason.get(reason, 0) + freed

    def outcome(self, outcome: str) -> None:
        """Count a request's one outcome (``OUTCOMES``)."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def collect(self, engine: Any) -> List[Any]:
        """The metric families, every sample labelled with the model (and the reason, or the outcome)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = getattr(engine, "stats", None)
        out = []
        for family, name, help_, value in (
            (GaugeMetricFamily, "dynamo_ctx_worker_running_requests", "Requests holding engine resources.",
             getattr(stats, "running_requests", 0)),
            (GaugeMetricFamily, "dynamo_ctx_worker_kv_blocks_in_use", "KV cache blocks in use.", getattr(stats, "kv_blocks_in_use", 0)),
            (CounterMetricFamily, "dynamo_ctx_worker_requests_total", "Requests received.", self.requests_total),
            (CounterMetricFamily, "dynamo_ctx_worker_busy_refusals_total",
             "Requests refused at once as busy (the worker at its capacity); they never reached the engine.",
             self.busy_refusals()),
            (CounterMetricFamily, "dynamo_ctx_worker_library_sent_tokens_total",
             "Output tokens the library sent to their callers itself, read from the engine's output stream "
             "(the others went through the worker's Python).", self.library_sent_tokens()),
            (CounterMetricFamily, "dynamo_ctx_worker_library_aborts_total",
             "Aborts the library sent the engine itself the moment a request's context stopped "
             "(the worker's own abort follows through vLLM).", self.library_aborts()),
        ):
            f = family(name, help_, labels=["model"])
            f.add_metric([self.model], value)
            out.append(f)
        peak = getattr(stats, "peak_running_requests", None)  # the mock engine's (vLLM's stats have no such figure)
        if peak is not None:
            f = GaugeMetricFamily("dynamo_ctx_worker_running_requests_peak", "The most requests the engine held at once.",
                                  labels=["model"])
            f.add_metric([self.model], peak)
            out.append(f)
        zeros = dict.fromkeys(reasons(), 0)
        for name, help_, by_reason in (
            ("dynamo_ctx_worker_cancellations_received_total", "Requests whose context was stopped or killed, by reason.",
             self.cancellations_by_reason),
            ("dynamo_ctx_worker_aborts_confirmed_total", "Engine aborts confirmed (resources freed), by reason.", self.aborts_by_reason),
            ("dynamo_ctx_worker_abort_freed_kv_blocks_total", "KV blocks freed by confirmed aborts, by reason.", self.freed_by_reason),
        ):
            f = CounterMetricFamily(name, help_, labels=["model", "reason"])
            for reason, n in sorted({**zeros, **by_reason}.items()):
                f.add_metric([self.model, reason], n)
            out.append(f)
        f = CounterMetricFamily("dynamo_ctx_worker_outcomes_total", "Requests by how they ended (each exactly once).",
                                labels=["model", "outcome"])
        for o in OUTCOMES:
            f.add_metric([self.model, o], self.outcomes.get(o, 0))
        out.append(f)
        return out

    def registry(self, engine: Any) -> Any:
        """A prometheus_client ``CollectorRegistry`` with this worker's metrics of ``engine``."""
        from prometheus_client import CollectorRegistry

        metrics = self

        class _Collector:
            def collect(self) -> Any:
                return metrics.collect(engine)

        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Collector())
        return reg

    def render(self, engine: Any) -> str:
        """Prometheus text exposition of this worker's metrics."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry(engine)).decode()

    def exposition(self, engine: Any) -> bytes:
        """The worker's ``/metrics``: prometheus_client's default registry (the
        engine's own metrics, e.g. vLLM's, and the process's) followed by
        this worker's."""
        from prometheus_client import REGISTRY, generate_latest

        return bytes(generate_latest(REGISTRY)) + bytes(generate_latest(self.registry(engine)))
