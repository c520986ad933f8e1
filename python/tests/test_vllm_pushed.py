"""The vLLM handlers' pushed outputs: served through a runtime, a request's engine
outputs are handed to the caller by the engine's output callback (the collector's
``put`` that ``add_request`` returns), not read by the handler's task one by one.
The caller sees what the engine's stream gives (``generate``, the path a handler
called directly still takes); a stop, a kill, an engine's death and an item that
cannot be sent end it as they end a read stream."""

from __future__ import annotations

import asyncio

import pytest

from dynamo_ctx import Context
from dynamo_ctx.backends.vllm import AggregatedHandler, PrefillHandler
from dynamo_ctx.mocker import MockAsyncLLM, MockEngineArgs
from dynamo_ctx.serving import item_sink
from harness import HANG
from helpers import ServedEndpoint, collect, run


class Engine(MockAsyncLLM):
    """The mock, counting the calls the handler makes."""

    def __init__(self, **kw):
        super().__init__(MockEngineArgs(**{"decode_time_per_token": 0.002, "prefill_time_per_token": 0.0, **kw}))
        self.generate_calls = 0
        self.add_request_calls = 0

    def generate(self, *a, **k):
        self.generate_calls += 1
        return super().generate(*a, **k)

    async def add_request(self, *a, **k):
        self.add_request_calls += 1
        return await super().add_request(*a, **k)


async def until(pred, limit=HANG):
    for _ in range(int(limit / 0.005)):
        if pred():
            return True
        await asyncio.sleep(0.005)
    return False


def test_served_outputs_are_pushed_and_match_the_read_stream(nats_url):
    """Through a runtime the handler pushes (add_request, no generate); the items are
    those the engine's stream gives when the handler is called directly."""
    request = {"token_ids": [5, 6, 7], "stop_conditions": {"max_tokens": 40}}

    async def main():
        engine = Engine()
        handler = AggregatedHandler(engine, "m")
        direct = [item async for item in handler.generate(request, Context("direct"))]
        assert engine.generate_calls == 1 and engine.add_request_calls == 0
        async with ServedEndpoint(nats_url, handler.generate) as h:
            ctx = Context("pushed")
            served = await collect(await h.client.generate(request, annotated=False, context=ctx))
        return engine, handler, direct, served

    engine, handler, direct, served = run(main())
    assert engine.generate_calls == 1 and engine.add_request_calls == 1
    assert served == direct
    assert sum(len(i["token_ids"]) for i in served) == 40 and served[-1]["finish_reason"] == "length"
    assert handler.metrics.outcomes["completed"] == 2
    assert engine.running_request_ids() == []


def test_prefill_pushes_its_transfer_parameters(nats_url):
    async def main():
        engine = Engine()
        async with ServedEndpoint(nats_url, PrefillHandler(engine, "m").generate) as h:
            return await collect(await h.client.generate({"token_ids": [1, 2, 3, 4]}, annotated=False))

    items = run(main())
    assert len(items) == 1 and len(items[0]["token_ids"]) == 1
    assert items[0]["kv_transfer_params"]["do_remote_prefill"] is True


def test_stop_and_kill_end_a_pushed_stream_and_abort_the_engine(nats_url):
    """stop_generating: the stream ends cleanly, nothing after it; kill: the
    handler's task is cancelled. Either way the engine aborts the request
    once, and the handler forgets it."""

    async def main():
        engine = Engine(decode_time_per_token=0.005)
        handler = AggregatedHandler(engine, "m")
        out = {}
        async with ServedEndpoint(nats_url, handler.generate) as h:
            for how in ("stop", "kill"):
                ctx = Context(f"{how}-me")
                long_request = {"token_ids": [1], "stop_conditions": {"max_tokens": 10_000}}
                stream = await h.client.generate(long_request, annotated=False, context=ctx)
                got = [await asyncio.wait_for(stream.__anext__(), HANG) for _ in range(3)]
                ctx.stop_generating() if how == "stop" else ctx.kill()
                async for item in stream:
                    got.append(item)
                assert await until(lambda: not engine.running_request_ids()), "the engine still holds it"
                assert await until(lambda: not handler._aborting)
                out[how] = got
        return engine, handler, out

    engine, handler, out = run(main())
    assert engine.stats.aborts_confirmed == 2
    assert handler.metrics.outcomes["stopped"] == 1 and handler.metrics.outcomes["cancelled"] == 1
    assert all(len(i["token_ids"]) == 1 for i in out["stop"])


def test_an_item_that_cannot_be_sent_fails_the_request_and_ends_it_in_the_engine(nats_url, monkeypatch):
    """An output whose item is not JSON (here: transfer parameters the engine
    made wrong) fails the request as a yielded one would; the engine's
    callback goes on for the others, and the failed request leaves the engine."""

    class Bad(Engine):
        def _transfer_params(self, req):
            return {"bad": object()}

    async def main():
        engine = Bad()
        handler = PrefillHandler(engine, "m")
        async with ServedEndpoint(nats_url, handler.generate) as h:
            with pytest.raises(Exception, match="not JSON"):
                await collect(await h.client.generate({"token_ids": [1, 2]}, annotated=False))
            assert await until(lambda: not engine.running_request_ids()), "the failed request is still in the engine"
            engine._transfer_params = MockAsyncLLM._transfer_params.__get__(engine)
            ok = await collect(await h.client.generate({"token_ids": [3]}, annotated=False, context=Context("after")))
        return engine, handler, ok

    engine, handler, ok = run(main())
    assert engine.running_request_ids() == []
    assert len(ok) == 1 and ok[0]["kv_transfer_params"]["do_remote_prefill"] is True  # the engine went on
    assert handler.metrics.outcomes["failed"] == 1


def test_engine_death_under_a_pushed_request_reaches_the_handler(nats_url):
    """The engine dying puts its error into every request's collector: the
    pushed request raises it, as a read one does (without an engine_dead
    hook the caller gets the error)."""

    async def main():
        engine = Engine(decode_time_per_token=0.005)
        handler = AggregatedHandler(engine, "m")
        async with ServedEndpoint(nats_url, handler.generate) as h:
            stream = await h.client.generate({"token_ids": [1], "stop_conditions": {"max_tokens": 10_000}}, annotated=False)
            await asyncio.wait_for(stream.__anext__(), HANG)
            engine.die("gone")
            with pytest.raises(Exception, match="gone"):
                await collect(stream)
        return handler

    handler = run(main())
    assert handler.metrics.outcomes["failed"] == 1


def test_item_sink_is_taken_once_and_only_in_its_task():
    """None outside a served request's task; there, the first call takes it."""
    from dynamo_ctx import serving

    assert item_sink() is None

    async def main():
        serving._sink.set(print)
        first, second = item_sink(), item_sink()
        serving._sink.set(print)
        child = await asyncio.get_running_loop().create_task(asyncio.sleep(0, "x"))  # a task started before the take
        return first, second, child

    assert run(main()) == (print, None, "x")


def test_a_wrapping_handler_gets_the_items(nats_url):
    """A user's handler that wraps the shipped one (a plain one, or one with
    functools.wraps, which copies the method's marks) sees every item: nothing
    bypasses it."""
    import functools

    async def main():
        engine = Engine()
        agg = AggregatedHandler(engine, "m")

        async def wrapper(request, context):
            async for item in agg.generate(request, context):
                yield {"wrapped": item}

        @functools.wraps(agg.generate)
        async def wraps_wrapper(request, context):
            async for item in agg.generate(request, context):
                yield {"wrapped": item}

        out = []
        request = {"token_ids": [1], "stop_conditions": {"max_tokens": 5}}
        for handler in (wrapper, wraps_wrapper):
            async with ServedEndpoint(nats_url, handler) as h:
                out.append(await collect(await h.client.generate(request, annotated=False)))
        return engine, out

    engine, out = run(main())
    assert engine.add_request_calls == 0 and engine.generate_calls == 2
    for items in out:
        assert [len(i["wrapped"]["token_ids"]) for i in items] == [1] * 5


def test_a_stop_while_the_engine_admits_the_request_aborts_it():
    """vLLM prepares a prompt in a thread before its engine knows the request:
    a stop meanwhile finds nothing to abort, so the handler aborts it again
    once admitted; the engine holds nothing after."""
    from dynamo_ctx import serving

    class SlowAdmit(Engine):
        async def add_request(self, *a, **k):
            await asyncio.sleep(0.05)
            return await super().add_request(*a, **k)

    async def main():
        engine = SlowAdmit(decode_time_per_token=0.005)
        handler = AggregatedHandler(engine, "m")
        items = []
        serving._sink.set(items.append)
        ctx = Context("stopped-while-admitted")
        task = asyncio.ensure_future(handler.generate({"token_ids": [1], "stop_conditions": {"max_tokens": 200}}, ctx).__anext__())
        await asyncio.sleep(0.01)
        ctx.stop_generating()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(task, HANG)
        held = engine.running_request_ids()
        await asyncio.sleep(0.1)
        return held, items, engine

    held, items, engine = run(main())
    assert held == [] and engine.running_request_ids() == [] and items == []


def test_the_engines_callback_never_raises():
    """Whatever happens to the request meanwhile (its task cancelled by a kill
    that the sink delivers, an item that fails, outputs after the end), put
    returns: an error there would fail every request of the engine."""
    from dynamo_ctx.backends import vllm as vllm_mod
    from dynamo_ctx.mocker import CompletionOutput, RequestOutput

    async def main():
        ctx = Context("callback")
        pushed = None

        def cancelling_sink(item):
            pushed.done.cancel()  # as a kill delivered from inside the sink cancels the waiting task

        pushed = vllm_mod._Pushed(vllm_mod._Items(False), cancelling_sink, ctx, lambda: None)
        last = RequestOutput("r", [1], [CompletionOutput(0, [7], "", "length")], True)
        pushed.put(last)
        pushed.put(last)  # after the end
        pushed.put(RuntimeError("after the end"))

        def failing_sink(item):
            raise TypeError("not JSON")

        failing = vllm_mod._Pushed(vllm_mod._Items(False), failing_sink, ctx, lambda: None)
        failing.put(RequestOutput("r", [1], [CompletionOutput(0, [7], "", None)], False))
        failing.put(last)
        with pytest.raises(TypeError):
            await failing.done
        return pushed.done.cancelled()

    assert run(main()) is True


def test_a_request_the_engine_refused_is_not_aborted(nats_url):
    class Refusing(Engine):
        async def add_request(self, *a, **k):
            raise ValueError("prompt too long for this engine")

        async def abort(self, *a, **k):
            self.aborts_called = getattr(self, "aborts_called", 0) + 1
            return await super().abort(*a, **k)

    async def main():
        engine = Refusing()
        async with ServedEndpoint(nats_url, AggregatedHandler(engine, "m").generate) as h:
            with pytest.raises(Exception, match="too long"):
                await collect(await h.client.generate({"token_ids": [1]}, annotated=False))
        return engine

    assert getattr(run(main()), "aborts_called", 0) == 0


def test_the_short_ways_check_is_every_unset_field():
    """vllm_lean's per-output check spells out _UNSET (for speed): the two agree,
    so a field named there is never left unchecked (the contract tests,
    python/tests/vllm_contract/test_vllm_lean.py, run it against vLLM)."""
    import inspect
    import re

    from dynamo_ctx.backends import vllm_lean

    checked = re.findall(r"out\.(\w+) is None", inspect.getsource(vllm_lean.LeanOutputs.process_outputs))
    assert sorted(checked) == sorted(vllm_lean._UNSET)


def test_the_mock_has_no_short_way():
    """The short way around vLLM's output processor is for vLLM's AsyncLLM alone:
    the mock's outputs all go through its collector."""
    from dynamo_ctx.backends.vllm import _lean_outputs

    assert _lean_outputs(Engine()) is None
