"""The vLLM handler's abort monitor (on_stopped + eager_task), driven
directly, without a request plane."""

from __future__ import annotations

import asyncio
import sys

import pytest

from dynamo_ctx import Context
from dynamo_ctx import _aio
from dynamo_ctx.backends import vllm as vllm_mod
from dynamo_ctx.backends.vllm import AggregatedHandler
from dynamo_ctx.mocker import MockAsyncLLM, MockEngineArgs
from helpers import run


def _callbacks():
    return len(_aio._waker()._callbacks)


def test_monitor_is_released_when_the_engine_call_fails(monkeypatch):
    """sampling_params_for (vLLM validates its SamplingParams) or
    engine.generate raising must not leave the stop watch registered: else a
    later stop runs the monitor, aborts a request that never ran and leaves
    its entry in _aborting for ever."""

    def bad_params(engine, max_tokens, options=None):
        raise ValueError("temperature must be non-negative")

    monkeypatch.setattr(vllm_mod, "sampling_params_for", bad_params)

    async def main():
        engine = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.0, prefill_time_per_token=0.0))
        h = AggregatedHandler(engine, "m")
        ctx = Context("bad-params")
        before = _callbacks()
        with pytest.raises(ValueError):
            async for _ in h._engine_stream(ctx, ctx.id(), {"prompt_token_ids": [1]}, 4):
                pass
        leaked = _callbacks() - before
        ctx.stop_generating()
        await asyncio.sleep(0.05)
        return leaked, h.metrics.cancellations_received_total, dict(h._aborting)

    leaked, aborts, aborting = run(main())
    assert leaked == 0, "the stop watch outlives the failed request"
    assert aborts == 0 and not aborting, f"a request that never ran was aborted: {aborting}"


def test_a_failed_abort_closes_the_engine_stream_and_forgets_it():
    """engine.abort raising in the handler's finally must not skip closing
    the engine's stream nor leave the request in _aborting."""

    class Engine(MockAsyncLLM):
        closed = False

        def generate(self, *a, **k):
            inner = super().generate(*a, **k)
            eng = self

            class Gen:
                def __aiter__(self):
                    return self

                async def __anext__(self):
                    return await inner.__anext__()

                async def aclose(self):
                    eng.closed = True
                    await inner.aclose()

            return Gen()

        async def abort(self, request_id):
            raise RuntimeError("engine dead")

    async def main():
        engine = Engine(MockEngineArgs(decode_time_per_token=0.001, prefill_time_per_token=0.0))
        h = AggregatedHandler(engine, "m")
        ctx = Context("abort-fails")
        err = None
        try:
            async for _item in h._engine_stream(ctx, ctx.id(), {"prompt_token_ids": [1]}, 10_000):
                ctx.stop_generating()
        except RuntimeError as e:
            err = e
        return err, engine.closed, dict(h._aborting)

    err, closed, aborting = run(main())
    assert isinstance(err, RuntimeError)  # reported: fine
    assert closed, "the engine's stream was left open"
    assert not aborting, "the request stays in _aborting for ever"


def test_no_abort_after_the_engine_finished():
    """A stop that arrives after the engine's last output (the request is
    done in the engine) must not count as a cancellation nor abort."""

    async def main():
        engine = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.0, prefill_time_per_token=0.0))
        h = AggregatedHandler(engine, "m")
        ctx = Context("late-stop")
        agen = h._engine_stream(ctx, ctx.id(), {"prompt_token_ids": [1]}, 2)
        items = []
        async for item in agen:
            items.append(item)
            if "finish_reason" in item:
                ctx.stop_generating()  # the client stops after the last token
                await asyncio.sleep(0.01)
        return items, h.metrics.cancellations_received_total

    items, aborts = run(main())
    assert items[-1].get("finish_reason") == "length"
    assert aborts == 0, "a finished request was aborted"


def test_stop_before_the_monitor_is_registered_aborts_once():
    async def main():
        engine = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.001, prefill_time_per_token=0.0))
        h = AggregatedHandler(engine, "m")
        ctx = Context("early")
        ctx.stop_generating()
        before = _callbacks()
        items = [i async for i in h._engine_stream(ctx, ctx.id(), {"prompt_token_ids": [1]}, 10_000)]
        await asyncio.sleep(0.01)
        return items, h.metrics.cancellations_received_total, h.metrics.aborts_confirmed_total, _callbacks() - before, dict(h._aborting)

    items, rec, conf, leaked, aborting = run(main())
    assert items == [] and rec == 1 and conf == 1 and leaked == 0 and not aborting


def test_an_engine_abort_that_needs_a_task_works_from_the_monitor():
    """The monitor runs in the loop's reader callback and eager_task runs the
    abort there up to its first suspension: as its own task, current then
    (Python 3.12's eager tasks, on every version), so an engine.abort using
    asyncio.timeout or wait_for (which need one on 3.11+ and 3.12+) works."""
    tasks = []

    class Engine(MockAsyncLLM):
        async def abort(self, request_id):
            tasks.append(asyncio.current_task())
            if sys.version_info >= (3, 11):
                async with asyncio.timeout(5):
                    return await super().abort(request_id)
            return await asyncio.wait_for(super().abort(request_id), 5)

    async def main():
        engine = Engine(MockEngineArgs(decode_time_per_token=0.001, prefill_time_per_token=0.0))
        h = AggregatedHandler(engine, "m")
        ctx = Context("needs-a-task")
        n = 0
        async for _item in h._engine_stream(ctx, ctx.id(), {"prompt_token_ids": [1]}, 10_000):
            n += 1
            if n == 3:
                asyncio.get_running_loop().call_soon(ctx.stop_generating)  # stopped from elsewhere
                await asyncio.sleep(0.01)  # the monitor runs
        return h.metrics.aborts_confirmed_total

    assert run(main()) == 1
    assert len(tasks) == 1 and tasks[0] is not None
