"""vLLM-style handlers over the mock engine: aborts on stop and kill, in decode and in prefill."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dynamo_ctx import Context, DistributedRuntime
from dynamo_ctx.backends.vllm import AggregatedHandler, DecodeHandler, PrefillHandler
from dynamo_ctx.mocker import MockAsyncLLM, MockEngineArgs
from harness import new_namespace
from helpers import run


class Served:
    """A handler served on its own runtime, at a unique path."""

    def __init__(self, nats_url, handler, path):
        self.runtime = DistributedRuntime(nats_url=nats_url)
        self.endpoint = self.runtime.endpoint(path)
        self.handler = handler
        self.aborted = asyncio.Queue()
        handler.abort_listeners.append(lambda rid, freed: self.aborted.put_nowait((rid, freed)))

    async def start(self):
        self.task = asyncio.ensure_future(self.endpoint.serve_endpoint(self.handler.generate))
        await self.endpoint.serving()
        return self

    async def client(self):
        c = await self.endpoint.client()
        await c.wait_for_instances()
        return c

    async def stop(self):
        self.runtime.shutdown()
        await self.task


def ns():
    return new_namespace("h")


@pytest.mark.parametrize("cancel", ["kill", "stop_generating"])
def test_aggregated_aborts_engine_during_decode(nats_url, cancel, caplog):
    async def main():
        engine = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.002))
        w = await Served(nats_url, AggregatedHandler(engine, "m"), f"{ns()}.backend.generate").start()
        client = await w.client()
        ctx = Context(f"agg-{cancel}")
        stream = await client.generate({"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 10_000}}, context=ctx)
        got = []
        async for item in stream:
            got.extend(item.data()["token_ids"])
            if len(got) >= 5:
                getattr(ctx, cancel)()
                break
        rid, freed = await w.aborted.get()
        assert rid == ctx.id() and freed >= 1
        assert engine.stats.running_requests == 0 and engine.stats.kv_blocks_in_use == 0
        assert engine.stats.aborts_confirmed == 1
        assert w.handler.metrics.cancellations_received_total == 1
        assert w.handler.metrics.aborts_confirmed_total == 1
        await w.stop()

    with caplog.at_level(logging.DEBUG, logger="dynamo_ctx.backends.vllm"):
        run(main())
    messages = [r.getMessage() for r in caplog.records]
    assert f"New Request ID: agg-{cancel}" in messages
    assert f"Aborted Request ID: agg-{cancel} (reason: {'kill' if cancel == 'kill' else 'stop_generating'})" in messages


def test_aggregated_complete_stream_has_all_tokens(nats_url):
    async def main():
        engine = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.0, prefill_time_per_token=0.0))
        w = await Served(nats_url, AggregatedHandler(engine, "m"), f"{ns()}.backend.generate").start()
        client = await w.client()
        items = [x.data() async for x in await client.generate({"token_ids": [5, 6], "max_tokens": 7})]
        tokens = [t for it in items for t in it["token_ids"]]
        assert len(tokens) == 7 and items[-1]["finish_reason"] == "length"
        assert engine.stats.aborts_confirmed == 0 and engine.stats.kv_blocks_in_use == 0
        await w.stop()

    run(main())


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_disaggregated_cancel_reaches_prefill(nats_url, phase, caplog):
    """A decode request cancelled while the prefill worker is busy aborts the prefill engine (before any token)."""

    async def main():
        space = ns()
        prefill_engine = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.01 if phase == "prefill" else 0.0))
        decode_engine = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.002))
        prefill = await Served(nats_url, PrefillHandler(prefill_engine, "m"), f"{space}.prefill.generate").start()
        prefill_client = await prefill.client()
        decode = await Served(nats_url, DecodeHandler(decode_engine, prefill_client, "m"), f"{space}.backend.generate").start()
        client = await decode.client()
        ctx = Context(f"disagg-{phase}")
        stream = await client.generate({"token_ids": list(range(1000)), "max_tokens": 10_000}, context=ctx)
        if phase == "prefill":
            # The prefill worker has started on it (the engine's key is the
            # context id plus random bits: see BaseWorkerHandler._engine_stream).
            while not any(
                r.startswith(ctx.id() + "-") and prefill_engine.phase(r) == "prefill" for r in prefill_engine.running_request_ids()
            ):
                await asyncio.sleep(0.001)
            ctx.kill()
            rid, _ = await prefill.aborted.get()
            assert rid == ctx.id()
            assert prefill_engine.stats.prefill_aborts == 1
            assert decode_engine.stats.requests_total == 0  # decode never started
        else:
            first = await stream.__anext__()
            assert len(first.data()["token_ids"]) == 1
            await stream.__anext__()
            ctx.kill()
            rid, _ = await decode.aborted.get()
            assert rid == ctx.id()
        for e in (prefill_engine, decode_engine):
            assert e.stats.running_requests == 0 and e.stats.kv_blocks_in_use == 0
        await decode.stop()
        await prefill.stop()

    with caplog.at_level(logging.DEBUG, logger="dynamo_ctx.backends.vllm"):
        run(main())
    messages = [r.getMessage() for r in caplog.records]
    assert f"New Prefill Request ID: disagg-{phase}" in messages
    if phase == "prefill":
        assert f"Aborted Prefill Request ID: disagg-{phase} (reason: kill)" in messages
    else:
        assert f"Aborted Request ID: disagg-{phase} (reason: kill)" in messages


def test_disaggregated_kv_transfer_as_vllm(nats_url):
    """The prefill runs with max_tokens=1 and asks do_remote_decode; the decode engine gets
    the prefill engine's own kv_transfer_params in SamplingParams.extra_args, runs the same
    prompt, and produces every token: the stream is the aggregated one, token for token."""

    async def main():
        space = ns()
        prefill_engine = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.0))
        decode_engine = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.0))
        prefill = await Served(nats_url, PrefillHandler(prefill_engine, "m"), f"{space}.prefill.generate").start()
        prefill_client = await prefill.client()
        decode = await Served(nats_url, DecodeHandler(decode_engine, prefill_client, "m"), f"{space}.backend.generate").start()
        client = await decode.client()
        request = {"token_ids": list(range(40)), "stop_conditions": {"max_tokens": 9}}
        items = [x.data() async for x in await client.generate(request)]
        tokens = [t for it in items for t in it["token_ids"]]
        ref = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.0))
        agg = await Served(nats_url, AggregatedHandler(ref, "m"), f"{ns()}.backend.generate").start()
        want = [t async for x in await (await agg.client()).generate(request) for t in x.data()["token_ids"]]
        assert tokens == want and len(tokens) == 9
        [(prefill_key, asked)] = prefill_engine.kv_transfer_params_received.items()
        assert asked == {"do_remote_decode": True}
        [(decode_key, given)] = decode_engine.kv_transfer_params_received.items()
        assert given["remote_engine_id"] == prefill_engine.engine_id and given["do_remote_prefill"] is True
        assert given["remote_request_id"] == prefill_key
        assert prefill_engine.stats.requests_total == 1 and decode_engine.stats.requests_total == 1
        for e in (prefill_engine, decode_engine):
            assert e.stats.running_requests == 0 and e.stats.kv_blocks_in_use == 0
        await agg.stop()
        await decode.stop()
        await prefill.stop()

    run(main())


def test_engine_death_calls_the_hook_and_ends_nothing_itself(nats_url):
    """An engine that dies under a request calls the handler's engine_dead hook once, and the
    handler sends neither an error nor an end: the worker's shutdown ends the stream (without
    its final marker, a migratable end). Without the hook, the caller gets the error."""

    async def main():
        engine = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.005))
        handler = AggregatedHandler(engine, "m")
        deaths = []
        handler.engine_dead = deaths.append
        path = f"{ns()}.backend.generate"
        w = await Served(nats_url, handler, path).start()
        caller = DistributedRuntime(nats_url=nats_url)  # another process's, as a frontend's
        client = await caller.endpoint(path).client()
        await client.wait_for_instances()
        stream = await client.generate({"token_ids": [1, 2, 3], "max_tokens": 10_000})
        await stream.__anext__()
        engine.die("the core process exited")
        for _ in range(200):
            if deaths:
                break
            await asyncio.sleep(0.01)
        assert len(deaths) == 1 and type(deaths[0]).__name__ == "EngineDeadError"
        w.runtime.shutdown()  # as the worker does on engine death
        with pytest.raises(ValueError, match="Stream ended before generation completed"):
            async for _ in stream:
                pass
        await w.task
        caller.shutdown()

        engine2 = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.005))
        w2 = await Served(nats_url, AggregatedHandler(engine2, "m"), f"{ns()}.backend.generate").start()
        stream = await (await w2.client()).generate({"token_ids": [1, 2, 3], "max_tokens": 10_000})
        await stream.__anext__()
        engine2.die("gone")
        with pytest.raises(ValueError, match="EngineDeadError: gone"):
            async for _ in stream:
                pass
        await w2.stop()

    run(main())


def test_same_request_id_runs_side_by_side(nats_url):
    """Two requests with one context id run in the engine side by side (its key is the id plus
    random bits), and killing one aborts only that one."""

    async def main():
        engine = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.002))
        w = await Served(nats_url, AggregatedHandler(engine, "m"), f"{ns()}.backend.generate").start()
        client = await w.client()
        victim, attacker = Context("same-id"), Context("same-id")
        n = 40
        vstream = await client.generate({"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": n}}, context=victim)
        astream = await client.generate({"token_ids": [4, 5], "stop_conditions": {"max_tokens": 10_000}}, context=attacker)
        await astream.__anext__()
        got = []
        async for item in vstream:
            got.extend(item.data()["token_ids"])
            if len(got) == 2:
                running = engine.running_request_ids()
                assert len(running) == 2 and all(r.startswith("same-id-") for r in running), running
                attacker.kill()
        rid, _ = await w.aborted.get()
        assert rid == "same-id"
        assert len(got) == n, "the victim's request was cut short"
        assert engine.stats.aborts_confirmed == 1
        assert engine.stats.running_requests == 0
        await w.stop()

    run(main())


def test_request_options_reach_the_engine_params():
    """stop_conditions.stop_token_ids / ignore_eos and sampling_options become SamplingParams fields."""
    from dynamo_ctx.backends.vllm import request_options, sampling_params_for

    request = {
        "token_ids": [1],
        "stop_conditions": {"max_tokens": 4, "stop_token_ids": [5], "ignore_eos": False},
        "sampling_options": {"seed": 3, "temperature": 0.5, "top_p": 0.9, "presence_penalty": None},
    }
    opts = request_options(request)
    assert opts == {"seed": 3, "temperature": 0.5, "top_p": 0.9, "stop_token_ids": [5], "ignore_eos": False}
    params = sampling_params_for(MockAsyncLLM(), 4, opts)
    assert (params.max_tokens, params.seed, params.stop_token_ids, params.top_p) == (4, 3, [5], 0.9)
    assert request_options({"token_ids": [1]}) == {}


def test_max_tokens_read_as_the_library_reads_it():
    """stop_conditions' max_tokens, else the top level's; none (or null) fills
    the rest of the context, as Dynamo's handler does; 16 without a context length."""
    from dynamo_ctx.backends.vllm import _max_tokens

    ids = {"token_ids": [1, 2, 3]}
    assert _max_tokens(dict(ids, stop_conditions={"max_tokens": 4}, max_tokens=9), 64) == 4
    assert _max_tokens(dict(ids, stop_conditions={"max_tokens": None}, max_tokens=9), 64) == 9
    assert _max_tokens(dict(ids, stop_conditions={"max_tokens": 0}), 64) == 0
    assert _max_tokens(dict(ids, stop_conditions={"max_tokens": None}), 64) == 61
    assert _max_tokens(ids, 2) == 1  # at least one, as Dynamo
    assert _max_tokens(ids, None) == 16
    assert _max_tokens({}, 8) == 8
    for bad in (10.0, "10", True, -1):  # as go/tokens reads it
        with pytest.raises(ValueError, match="max_tokens must be an integer of 0 or more"):
            _max_tokens(dict(ids, stop_conditions={"max_tokens": bad}), 64)


async def serve_mode(nats_url, mode):
    """A mock engine behind an aggregated handler ("agg"), or behind a prefill and
    a decode handler ("disagg"): the engine, the handler the caller reaches, and
    what is served (the caller's last)."""
    engine = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.0005))
    name = ns()
    if mode == "agg":
        handler = AggregatedHandler(engine, "m")
        return engine, handler, [await Served(nats_url, handler, f"{name}.backend.generate").start()]
    prefill = await Served(nats_url, PrefillHandler(engine, "m"), f"{name}.prefill.generate").start()
    handler = DecodeHandler(engine, await prefill.client(), "m")
    return engine, handler, [prefill, await Served(nats_url, handler, f"{name}.backend.generate").start()]


@pytest.mark.parametrize("mode", ["agg", "disagg"])
def test_refused_requests_are_counted_once(nats_url, mode, monkeypatch):
    """A request that fails before the engine runs it (a max_tokens that is not
    an integer; one the engine's parameters refuse, as vLLM's SamplingParams
    refuses some) counts as a request with one outcome, "failed", as any other."""
    import dynamo_ctx.backends.vllm as backend

    made = backend.sampling_params_for

    def refusing(engine, max_tokens, options=None):
        if max_tokens == 7:
            raise ValueError("the engine refuses 7")
        return made(engine, max_tokens, options)

    monkeypatch.setattr(backend, "sampling_params_for", refusing)

    async def main():
        engine, handler, served = await serve_mode(nats_url, mode)
        client = await served[-1].client()
        bad = [{"token_ids": [1], "max_tokens": "10"}, {"token_ids": [1], "max_tokens": 7}]
        for request in bad:
            stream = await client.generate(request, context=Context(new_namespace("ctx")), annotated=False)
            with pytest.raises(ValueError, match="ValueError"):
                async for _ in stream:
                    pass
        assert handler.metrics.requests_total == len(bad)
        assert handler.metrics.outcomes["failed"] == len(bad)
        assert sum(handler.metrics.outcomes.values()) == len(bad)
        for w in reversed(served):
            await w.stop()

    run(main())


@pytest.mark.parametrize("mode", ["agg", "disagg"])
def test_spent_budget_answers_length_without_the_engine(nats_url, mode):
    """max_tokens 0 (a migration's retry after every token arrived, where the
    library could not tell): one item, no tokens, "length", and no engine
    request (vLLM's SamplingParams refuses 0); the outcome is counted."""

    async def main():
        engine, handler, served = await serve_mode(nats_url, mode)
        client = await served[-1].client()
        request = {"token_ids": [1, 2, 3], "max_tokens": 0, "stop_conditions": {"max_tokens": None}}
        stream = await client.generate(request, context=Context(new_namespace("ctx")))
        assert [item.data() async for item in stream] == [{"token_ids": [], "finish_reason": "length"}]
        assert engine.stats.requests_total == 0  # neither prefill nor decode asked
        assert (handler.metrics.requests_total, handler.metrics.outcomes["completed"]) == (1, 1)
        for w in reversed(served):
            await w.stop()

    run(main())


def test_request_without_max_tokens_fills_the_context(nats_url):
    """A caller that sets no max_tokens (Dynamo's frontend, for a chat without
    one) gets the rest of the context, not vLLM's default of 16."""

    async def main():
        engine = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.0005))
        handler = AggregatedHandler(engine, "m")
        assert handler.max_model_len is None  # the mock has no model_config: the worker's command sets it
        handler.max_model_len = 40
        w = await Served(nats_url, handler, f"{ns()}.backend.generate").start()
        client = await w.client()
        for request in ({"token_ids": [1, 2, 3]}, {"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": None}}):
            stream = await client.generate(request, context=Context(new_namespace("ctx")))
            items = [item.data() async for item in stream]
            assert sum(len(i["token_ids"]) for i in items) == 37
            assert items[-1]["finish_reason"] == "length"
        await w.stop()

    run(main())


@pytest.mark.parametrize("kind", ["mock", "other engine"])
def test_items_carry_new_tokens_whatever_the_output_kind(nats_url, kind):
    """The mock (and vLLM) are asked for DELTA outputs; an engine of another
    class gets the default params (CUMULATIVE outputs): the items are the same."""
    from dynamo_ctx.backends.mocker import RequestOutputKind
    from dynamo_ctx.backends.vllm import sampling_params_for

    class OtherEngine:  # AsyncLLM's interface over the mock, but not the mock's class
        def __init__(self):
            self.inner = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.0, prefill_time_per_token=0.0))

        def generate(self, prompt, params, request_id, **kw):
            return self.inner.generate(prompt, params, request_id, **kw)

        async def abort(self, request_id):
            return await self.inner.abort(request_id)

    async def main():
        engine = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.0, prefill_time_per_token=0.0)) if kind == "mock" else OtherEngine()
        want = RequestOutputKind.DELTA if kind == "mock" else RequestOutputKind.CUMULATIVE
        assert sampling_params_for(engine, 3).output_kind is want
        w = await Served(nats_url, AggregatedHandler(engine, "m"), f"{ns()}.backend.generate").start()
        client = await w.client()
        items = [x.data() async for x in await client.generate({"token_ids": [5, 6], "max_tokens": 9})]
        assert [len(it["token_ids"]) for it in items] == [1] * 9
        ref = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.0, prefill_time_per_token=0.0))
        expect = [o async for o in ref.generate([5, 6], {"max_tokens": 9}, "ref")][-1].outputs[0].token_ids
        assert [t for it in items for t in it["token_ids"]] == expect
        await w.stop()

    run(main())


def test_items_carry_the_engines_logprobs():
    """add_logprobs: each token's log probability and the engine's candidates in its order
    (the sampled token first), -inf written as the floor JSON can carry."""
    from collections import namedtuple

    from dynamo_ctx.backends.vllm import LOGPROB_FLOOR, add_logprobs

    Lp = namedtuple("Lp", "logprob rank decoded_token")
    steps = [{7: Lp(-0.25, 2, None), 3: Lp(-0.1, 1, None)}, {5: Lp(float("-inf"), 9, None)}]
    item = {"token_ids": [7, 5]}
    add_logprobs(item, [7, 5], steps)
    assert item["log_probs"] == [-0.25, LOGPROB_FLOOR]
    assert item["top_logprobs"] == [
        [{"token_id": 7, "logprob": -0.25, "rank": 2}, {"token_id": 3, "logprob": -0.1, "rank": 1}],
        [{"token_id": 5, "logprob": LOGPROB_FLOOR, "rank": 9}],
    ]
