"""The mock engine (docs/design.md, section 8): vLLM AsyncLLM's interface, resources tracked, aborts free them."""

from __future__ import annotations

import asyncio

import pytest

from dynamo_ctx.backends.mocker import RequestOutputKind
from dynamo_ctx.mocker import MockAsyncLLM, MockEngineArgs, SamplingParams
from helpers import run



def engine(**kw):
    return MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.0, block_size=4, **kw))


def test_generates_deterministic_cumulative_tokens():
    async def main():
        e = engine()
        outs = [o async for o in e.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=5), "r1")]
        assert [len(o.outputs[0].token_ids) for o in outs] == [1, 2, 3, 4, 5]
        final = outs[-1]
        assert final.finished and final.outputs[0].finish_reason == "length"
        # Continuation: the same prompt extended by two tokens yields the rest.
        more = [o async for o in e.generate({"prompt_token_ids": [1, 2, 3] + final.outputs[0].token_ids[:2]}, {"max_tokens": 3}, "r2")]
        assert more[-1].outputs[0].token_ids == final.outputs[0].token_ids[2:]
        assert e.stats.running_requests == 0 and e.stats.kv_blocks_in_use == 0
        assert e.stats.requests_total == 2

    run(main())


def test_output_kinds_delta_and_final_only():
    async def main():
        e = engine()
        full = [o.outputs[0].token_ids async for o in e.generate([1, 2, 3], SamplingParams(max_tokens=5), "c")]
        delta = [o async for o in e.generate([1, 2, 3], SamplingParams(max_tokens=5, output_kind=RequestOutputKind.DELTA), "d")]
        assert [o.outputs[0].token_ids for o in delta] == [[t] for t in full[-1]]
        assert [o.finished for o in delta] == [False] * 4 + [True]
        final = [o async for o in e.generate([1, 2, 3], SamplingParams(max_tokens=5, output_kind=RequestOutputKind.FINAL_ONLY), "f")]
        assert len(final) == 1 and final[0].finished and final[0].outputs[0].token_ids == full[-1]
        # An aborted DELTA request ends with an "abort" output carrying no new token.
        gen = e.generate([1, 2, 3], SamplingParams(max_tokens=1000, output_kind=RequestOutputKind.DELTA), "a")
        first = await gen.__anext__()
        assert len(first.outputs[0].token_ids) == 1
        await e.abort("a")
        rest = [o async for o in gen]
        assert rest[-1].outputs[0].finish_reason == "abort" and rest[-1].outputs[0].token_ids == []
        assert e.stats.running_requests == 0 and e.stats.kv_blocks_in_use == 0

    run(main())


def test_tracks_running_requests_and_kv_blocks():
    async def main():
        e = engine()
        gen = e.generate(list(range(10)), SamplingParams(max_tokens=8), "r")
        first = await gen.__anext__()
        assert first.outputs[0].token_ids and e.running_request_ids() == ["r"]
        assert e.stats.kv_blocks_in_use == 3  # ceil(11 / 4)
        assert e.phase("r") == "decode"
        async for _ in gen:
            pass
        assert e.stats.kv_blocks_in_use == 0 and e.running_request_ids() == []
        assert e.phase("r") is None

    run(main())


def test_abort_during_decode_frees_everything():
    async def main():
        e = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.001, block_size=4))
        gen = e.generate(list(range(16)), SamplingParams(max_tokens=1000), "r")
        await gen.__anext__()
        held = e.stats.kv_blocks_in_use
        assert held >= 4
        freed = await e.abort("r")
        assert freed == held
        assert e.stats.kv_blocks_in_use == 0 and e.stats.running_requests == 0
        assert e.stats.aborts_confirmed == 1 and e.confirmed_aborts["r"] == held
        rest = [o async for o in gen]
        assert rest[-1].outputs[0].finish_reason == "abort" and rest[-1].finished
        assert await e.abort("r") == 0  # idempotent
        assert e.stats.aborts_requested == 1

    run(main())


def test_abort_during_prefill_interrupts_it():
    async def main():
        e = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=1.0))  # an hour-long prefill for 3600 tokens
        gen = e.generate(list(range(3600)), SamplingParams(max_tokens=4), "long")
        nxt = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0)
        assert e.phase("long") == "prefill"
        await e.abort("long")
        out = await nxt  # returns at once, not after an hour
        assert out.outputs[0].finish_reason == "abort" and out.outputs[0].token_ids == []
        assert e.stats.prefill_aborts == 1 and e.stats.kv_blocks_in_use == 0

    run(main())


def test_duplicate_request_id_rejected():
    async def main():
        e = engine()
        gen = e.generate([1], SamplingParams(max_tokens=3), "dup")
        await gen.__anext__()
        with pytest.raises(ValueError):
            await e.generate([1], SamplingParams(max_tokens=3), "dup").__anext__()
        await gen.aclose()

    run(main())


def test_seed_and_stop_token_ids():
    """A request's seed replaces the engine's; a stop token ends the request with "stop" (and is output)."""

    async def main():
        e = engine(seed=1000)
        seeded = [o async for o in e.generate({"prompt_token_ids": [1, 2]}, SamplingParams(max_tokens=3, seed=7), "s1")]
        assert seeded[-1].outputs[0].token_ids == [9, 10, 11]
        default = [o async for o in e.generate({"prompt_token_ids": [1, 2]}, {"max_tokens": 3}, "s2")]
        assert default[-1].outputs[0].token_ids == [1002, 1003, 1004]
        stopped = [
            o
            async for o in e.generate(
                {"prompt_token_ids": [1, 2]}, {"max_tokens": 10, "stop_token_ids": [1003], "temperature": 0.8, "top_p": 0.5}, "s3"
            )
        ]
        final = stopped[-1]
        assert final.finished and final.outputs[0].finish_reason == "stop"
        assert final.outputs[0].token_ids == [1002, 1003]
        assert e.stats.running_requests == 0 and e.stats.kv_blocks_in_use == 0 and e.stats.aborts_confirmed == 0

    run(main())


def test_one_step_loop_for_all_requests():
    """Fifty requests share the engine's steps: one decode step emits a token
    for each (6 steps for 5 tokens: a prefill step, then 5 decode steps), not
    one timer per request per token."""

    async def main():
        e = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0001, decode_time_per_token=0.002, block_size=4))

        async def one(i):
            return [o async for o in e.generate([i, i + 1], SamplingParams(max_tokens=5), f"r{i}")]

        results = await asyncio.gather(*[one(i) for i in range(50)])
        for outs in results:
            assert [len(o.outputs[0].token_ids) for o in outs] == [1, 2, 3, 4, 5]
            assert outs[-1].outputs[0].token_ids == [(1000 + 2 + k) % 32000 for k in range(5)]
        assert e.stats.steps <= 8, e.stats.steps
        assert e.stats.running_requests == 0 and e.stats.kv_blocks_in_use == 0
        await asyncio.sleep(0)
        assert e._stepper is None or e._stepper.done(), "the step loop stops when idle"

    run(main())


def test_abort_of_the_last_request_ends_a_long_step():
    """An abort takes effect at once, and the step loop (sleeping an hour-long
    prefill step) stops when no request is left: no task outlives the work."""

    async def main():
        e = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=10.0, prefill_chunk_tokens=400))
        gen = e.generate(list(range(400)), SamplingParams(max_tokens=2), "long")
        nxt = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0.01)
        assert e.phase("long") == "prefill" and e._stepper is not None and not e._stepper.done()
        await e.abort("long")
        assert (await nxt).outputs[0].finish_reason == "abort"
        await asyncio.wait_for(asyncio.shield(e._stepper), 1.0)
        assert e.stats.steps == 1 and e.stats.prefill_aborts == 1

    run(main())


def test_zero_max_tokens_and_decode_only_requests():
    async def main():
        e = engine()
        assert [o async for o in e.generate([1, 2, 3], SamplingParams(max_tokens=0), "z")] == []
        decode = SamplingParams(max_tokens=2, extra_args={"kv_transfer_params": {"do_remote_prefill": True}})
        outs = [o async for o in e.generate([1, 2, 3], decode, "d")]
        assert [len(o.outputs[0].token_ids) for o in outs] == [1, 2]
        assert e.stats.running_requests == 0 and e.stats.kv_blocks_in_use == 0

    run(main())


def test_kv_transfer_as_vllm_does_it():
    """A prefill asked for do_remote_decode ends with the parameters a decode
    engine pulls from (as vLLM's connector returns them); a decode that brings
    them skips its prefill and continues with the same tokens; both engines
    record what they received."""

    async def main():
        prefill = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.0, block_size=4))
        decode = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=10.0, decode_time_per_token=0.0, block_size=4))
        ask = SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": {"do_remote_decode": True}})
        outs = [o async for o in prefill.generate({"prompt_token_ids": list(range(10))}, ask, "p")]
        params = outs[-1].kv_transfer_params
        assert params["do_remote_prefill"] is True and params["remote_engine_id"] == prefill.engine_id
        assert params["remote_block_ids"] == [0, 1, 2]
        assert prefill.kv_transfer_params_received["p"] == {"do_remote_decode": True}
        assert all(o.kv_transfer_params is None for o in outs[:-1])
        take = SamplingParams(max_tokens=3, output_kind=RequestOutputKind.DELTA, extra_args={"kv_transfer_params": params})
        # A prefill of 10 tokens at 10 s each would take 100 s: the decode skips it.
        got = await asyncio.wait_for(_collect(decode.generate({"prompt_token_ids": list(range(10))}, take, "d")), 5)
        assert got[0] == outs[-1].outputs[0].token_ids[0]  # the token the prefill engine made
        assert decode.kv_transfer_params_received["d"] == params
        plain = [o async for o in prefill.generate({"prompt_token_ids": list(range(10))}, SamplingParams(max_tokens=1), "q")]
        assert plain[-1].kv_transfer_params is None

    run(main())


async def _collect(gen):
    out = []
    async for o in gen:
        out.extend(o.outputs[0].token_ids)
    return out


def test_vocabulary():
    """With token_ids, the mock produces only those ids, deterministically."""

    async def main():
        vocab = [5, 17, 99]
        e = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.0, token_ids=vocab))
        got = await _collect(e.generate([1, 2], SamplingParams(max_tokens=7, output_kind=RequestOutputKind.DELTA), "v"))
        assert set(got) <= set(vocab) and len(got) == 7
        again = await _collect(e.generate([1, 2], SamplingParams(max_tokens=7, output_kind=RequestOutputKind.DELTA), "w"))
        assert again == got

    run(main())


def test_die_ends_running_and_later_requests():
    """die(): a running generate raises EngineDeadError, as do later calls and
    abort; errored turns true; resources are released."""
    from dynamo_ctx.backends.mocker import EngineDeadError

    async def main():
        e = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.01))
        got = []

        async def consume():
            async for o in e.generate([1, 2], SamplingParams(max_tokens=1000), "x"):
                got.append(o)

        task = asyncio.ensure_future(consume())
        while not got:
            await asyncio.sleep(0.005)
        assert not e.errored
        e.die("core process exited")
        try:
            await asyncio.wait_for(task, 5)
            raise AssertionError("generate did not raise")
        except EngineDeadError as err:
            assert "core process exited" in str(err)
        assert e.errored and e.stats.running_requests == 0 and e.stats.kv_blocks_in_use == 0
        try:
            await e.generate([1], SamplingParams(max_tokens=1), "y").__anext__()
            raise AssertionError("generate on a dead engine did not raise")
        except EngineDeadError:
            pass
        try:
            await e.abort("x")
            raise AssertionError("abort on a dead engine did not raise")
        except EngineDeadError:
            pass

    run(main())


def test_max_num_seqs_holds_the_rest_first_come_first_served():
    """As vLLM's scheduler: at most max_num_seqs sequences run (prefill or decode) at once;
    the rest wait, in order, and start as places free; an aborted waiter frees nothing it
    never held; decode-only requests (a remote prefill) wait for a place too."""

    async def main():
        e = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.002, block_size=4, max_num_seqs=2))
        most = 0
        started: list = []

        async def one(rid, n, params=None):
            nonlocal most
            first = True
            async for _ in e.generate([1, 2, 3], params or SamplingParams(max_tokens=n), rid):
                if first:
                    started.append(rid)
                    first = False
                running = len(e.running_request_ids()) - len(e.waiting_request_ids())
                most = max(most, running)

        decode_only = SamplingParams(max_tokens=3, extra_args={"kv_transfer_params": {"do_remote_prefill": True}})
        tasks = [asyncio.ensure_future(one(f"r{i}", 5)) for i in range(5)]
        tasks.append(asyncio.ensure_future(one("d", 3, decode_only)))
        await asyncio.sleep(0.004)
        assert set(e.waiting_request_ids()) >= {"r2", "r3", "r4", "d"}
        victim = asyncio.ensure_future(one("gone", 5))
        await asyncio.sleep(0)
        await e.abort("gone")
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        await asyncio.wait_for(victim, 5)
        assert most <= 2, most
        started = [rid for rid in started if rid != "gone"]  # its one output is the abort's
        assert started[:2] == ["r0", "r1"] and started[2:] == ["r2", "r3", "r4", "d"], started
        assert e.stats.running_requests == 0 and e.stats.kv_blocks_in_use == 0 and e._scheduled == 0

    run(main())
