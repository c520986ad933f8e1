"""The mock engine (docs/design.md, section 8): vLLM AsyncLLM's interface, resources tracked, aborts free them."""

from __future__ import annotations

import asyncio

import pytest

from dynamo_ctx.backends.mocker import RequestOutputKind
from dynamo_ctx.mocker import MockAsyncLLM, MockEngineArgs, SamplingParams
from helpers import run



def engine(**kw):
    kw = {"prefill_time_per_token": 0.0, "decode_time_per_token": 0.0, "block_size": 4, **kw}
    return MockAsyncLLM(MockEngineArgs(**kw))


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
        e = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=10.0, max_num_batched_tokens=400))
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
        assert e.stats.running_requests == 0 and e.stats.kv_blocks_in_use == 0 and e.stats.num_requests_running == 0

    run(main())


# --------------------------------------------------------------------------- vLLM V1's scheduler shape


def record_steps(e):
    """The (sequences, tokens) of every step ``e`` runs, from its step_time."""
    shapes = []
    step_time = e.step_time

    def recording(seqs, tokens):
        shapes.append((seqs, tokens))
        return step_time(seqs, tokens)

    e.step_time = recording
    return shapes


def assert_idle(e):
    s = e.stats
    assert (s.running_requests, s.num_requests_running, s.num_requests_waiting, s.kv_blocks_in_use) == (0, 0, 0, 0), s
    assert e.running_request_ids() == [] and e.waiting_request_ids() == [] and s.kv_cache_usage == 0.0


async def first_token_steps(e, prompts, max_tokens):
    """Run one request a prompt, concurrently: the engine step at which each got its first token, and their outputs."""
    firsts, outs = {}, {}

    async def one(rid, prompt):
        got = []
        async for o in e.generate(prompt, SamplingParams(max_tokens=max_tokens), rid):
            if not got:
                firsts[rid] = e.stats.steps
            got.append(o)
        outs[rid] = got

    await asyncio.gather(*[one(f"r{i}", p) for i, p in enumerate(prompts)])
    return firsts, outs


def test_continuous_batching_admits_every_prompt_in_one_step():
    """Forty prompts that arrive together are prefilled in the same step (the
    budget holds them all) and decode together: 3 tokens take 3 steps, not 120."""

    async def main():
        e = MockAsyncLLM(MockEngineArgs(decode_time_per_token=0.001, prefill_time_per_token=0.0, block_size=4))
        shapes = record_steps(e)
        firsts, outs = await first_token_steps(e, [[i] * 10 for i in range(40)], 3)
        assert set(firsts.values()) == {1}, firsts
        assert e.stats.steps == 3 and shapes == [(40, 400), (40, 40), (40, 40)], shapes
        assert all(len(o[-1].outputs[0].token_ids) == 3 for o in outs.values())
        assert_idle(e)

    run(main())


def test_token_budget_is_respected_every_step():
    """With max_num_batched_tokens=64, twenty 30-token prompts are prefilled
    64 tokens a step (chunks may end mid-prompt), decode tokens count against
    the same budget, and every token is scheduled once."""

    async def main():
        e = engine(max_num_batched_tokens=64)
        shapes = record_steps(e)
        waiting_seen = []
        e_schedule = e._sched.schedule

        def schedule():
            out = e_schedule()
            waiting_seen.append(e.stats.num_requests_waiting)
            return out

        e._sched.schedule = schedule
        firsts, outs = await first_token_steps(e, [[i] * 30 for i in range(20)], 4)
        assert all(tokens <= 64 for _, tokens in shapes), shapes
        assert sum(tokens for _, tokens in shapes) == 20 * 30 + 20 * 3  # each prompt once, then one token per further output
        assert sum(1 for _, tokens in shapes if tokens == 64) >= 9, shapes  # the budget is filled while prompts wait
        order = [firsts[f"r{i}"] for i in range(20)]
        assert max(waiting_seen) > 0 and order == sorted(order) and order[0] < order[-1]  # first come first served
        for rid, o in outs.items():
            assert [len(x.outputs[0].token_ids) for x in o] == [1, 2, 3, 4], rid
        assert_idle(e)

    run(main())


def test_chunked_prefill_of_a_long_prompt_beside_a_decode():
    """A 300-token prompt with a budget of 64 is prefilled over five steps
    while a running stream keeps decoding a token each step (running requests
    are scheduled first); its blocks grow chunk by chunk; its first token comes
    with its last chunk."""

    async def main():
        e = engine(max_num_batched_tokens=64)
        shapes = record_steps(e)
        blocks = []
        step_time = e.step_time

        def probe(seqs, tokens):  # right after the step is scheduled
            r = e._running.get("long")
            if r is not None and r.phase == "prefill":
                blocks.append(r.blocks)
            return step_time(seqs, tokens)

        e.step_time = probe
        short = e.generate([1, 2], SamplingParams(max_tokens=20, output_kind=RequestOutputKind.DELTA), "short")
        await short.__anext__()
        long = e.generate(list(range(300)), SamplingParams(max_tokens=2), "long")
        first = await long.__anext__()
        assert first.outputs[0].token_ids == [(1000 + 300) % 32000]
        at = shapes.index((2, 64))
        assert shapes[at:at + 5] == [(2, 64)] * 4 + [(2, 1 + 300 - 4 * 63)], shapes  # 1 decode token + 63 prompt tokens a step
        assert shapes[:at] == [(1, 2)] + [(1, 1)] * (at - 1), shapes
        assert blocks == [16, 32, 48, 63, 75], blocks  # 63, 126, 189, 252, 300 prompt tokens (block_size 4)
        short_tokens = [t for o in [o async for o in short] for t in o.outputs[0].token_ids]
        assert len(short_tokens) == 19  # one a step all along
        await long.aclose()
        assert_idle(e)

    run(main())


def preemption_engine(**kw):
    """Three requests of 8 prompt tokens and 16 output tokens: 23 computed tokens, 6 blocks of 4 each, 18 in all."""
    return engine(num_kv_blocks=12, **kw)


PREEMPTION_REQUESTS = [
    ("a", [1] * 8, SamplingParams(max_tokens=16)),
    ("b", [2] * 8, SamplingParams(max_tokens=16, seed=5)),
    ("c", [3] * 8, SamplingParams(max_tokens=16, output_kind=RequestOutputKind.DELTA)),
]


async def run_all(e, requests):
    async def one(rid, prompt, params):
        return rid, [o async for o in e.generate(prompt, params, rid)]

    return dict(await asyncio.gather(*[one(*r) for r in requests]))


def test_preemption_when_blocks_run_out_is_token_exact():
    """Twelve blocks cannot hold three sequences of six: when "a" needs a
    block, "c" (admitted last) is preempted, frees its blocks, waits, and is
    recomputed (prompt and tokens so far) once blocks are free. Its output is
    token for token what it is without preemption, and no token comes twice."""

    async def main():
        ref = await run_all(engine(), PREEMPTION_REQUESTS)
        e = preemption_engine()
        shapes = record_steps(e)
        got = await run_all(e, PREEMPTION_REQUESTS)
        assert e.stats.num_preemptions == 1
        assert max(tokens for _, tokens in shapes) == 8 + 8 + 8
        assert any(tokens > 2 for seqs, tokens in shapes[1:] if seqs == 1), shapes  # the recompute of "c"
        for rid in ("a", "b"):
            assert [len(o.outputs[0].token_ids) for o in got[rid]] == list(range(1, 17)), rid
            assert got[rid][-1].outputs[0].token_ids == ref[rid][-1].outputs[0].token_ids, rid
        delta = [t for o in got["c"] for t in o.outputs[0].token_ids]
        assert delta == [t for o in ref["c"] for t in o.outputs[0].token_ids] and len(delta) == 16
        assert all(len(o.outputs[0].token_ids) == 1 for o in got["c"])
        assert got["c"][-1].outputs[0].finish_reason == "length"
        assert_idle(e)

    run(main())


async def until(cond, what):
    for _ in range(10000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never: {what}")


def test_abort_frees_blocks_at_once_running_waiting_and_preempted():
    async def main():
        # Preempted: "c" holds no block and waits; its abort ends its stream and frees nothing more.
        e = preemption_engine(decode_time_per_token=0.001)
        tasks = asyncio.ensure_future(run_all(e, PREEMPTION_REQUESTS))
        await until(lambda: e.stats.num_preemptions == 1, "a preemption")
        assert e.waiting_request_ids() == ["c"] and e.phase("c") == "decode" and e._running["c"].blocks == 0
        in_use = e.stats.kv_blocks_in_use
        assert await e.abort("c") == 0 and e.stats.kv_blocks_in_use == in_use
        assert e.waiting_request_ids() == [] and e.stats.num_requests_waiting == 0 and e.stats.aborts_confirmed == 1
        got = await tasks
        assert got["c"][-1].outputs[0].finish_reason == "abort" and len(got["a"]) == 16
        assert e.stats.prefill_aborts == 0
        assert_idle(e)

        # Waiting for a place: its abort frees nothing and takes it off the queue.
        e = engine(max_num_seqs=1, decode_time_per_token=0.001)
        first = e.generate([1, 2], SamplingParams(max_tokens=50), "first")
        await first.__anext__()
        second = e.generate([1, 2], SamplingParams(max_tokens=5), "second")
        pending = asyncio.ensure_future(second.__anext__())
        await until(lambda: e.waiting_request_ids() == ["second"], "second waits")
        assert e.stats.num_requests_waiting == 1 and e.stats.num_requests_running == 1
        assert await e.abort("second") == 0 and e.stats.num_requests_waiting == 0
        assert (await pending).outputs[0].finish_reason == "abort" and e.stats.prefill_aborts == 1
        assert await e.abort("first") == e.confirmed_aborts["first"] > 0
        assert_idle(e)

        # Running, in the middle of a (long) chunked prefill step: every block it took, at once.
        e = engine(max_num_batched_tokens=64, prefill_time_per_token=1.0)
        gen = e.generate(list(range(300)), SamplingParams(max_tokens=2), "long")
        nxt = asyncio.ensure_future(gen.__anext__())
        await until(lambda: e.stats.kv_blocks_in_use == 16, "the first chunk's blocks")
        assert await e.abort("long") == 16 and e.stats.kv_blocks_in_use == 0
        assert (await nxt).outputs[0].finish_reason == "abort"
        assert_idle(e)

    run(main())


def test_remote_prefill_costs_nothing_but_waits_for_its_blocks():
    """A decode whose prompt was prefilled elsewhere computes one token (a
    step of one sequence and one token) but needs its whole prompt's blocks:
    it waits while they are taken, rather than failing."""

    async def main():
        e = engine(num_kv_blocks=12, prefill_time_per_token=10.0)  # a prompt token here would take 10 s
        e.args.prefill_time_per_token = 0.0
        hog = e.generate([1] * 32, SamplingParams(max_tokens=5), "hog")  # 8 blocks, then 9
        await hog.__anext__()
        e.args.prefill_time_per_token = 10.0
        shapes = record_steps(e)
        held = []
        step_time = e.step_time

        def probe(seqs, tokens):
            held.append((e.waiting_request_ids(), e.stats.kv_blocks_in_use))
            return step_time(seqs, tokens)

        e.step_time = probe
        remote = SamplingParams(max_tokens=3, extra_args={"kv_transfer_params": {"do_remote_prefill": True}})
        gen = e.generate(list(range(40)), remote, "remote")  # 10 blocks
        first = asyncio.ensure_future(gen.__anext__())
        await until(lambda: e.waiting_request_ids() == ["remote"], "the remote decode waits")
        async for _ in hog:
            pass
        out = await asyncio.wait_for(first, 5)
        assert out.outputs[0].token_ids == [1040]
        queued = next(i for i, (waiting, _) in enumerate(held) if waiting)  # it came while the hog ran
        admitted = next(i for i in range(queued, len(held)) if not held[i][0])
        assert admitted > queued and shapes[admitted] == (1, 1) and held[admitted][1] == 10  # the hog ended; its prompt's blocks
        assert all(kv == 9 for _, kv in held[queued:admitted]), held  # the hog's 33..36 tokens: too few blocks left
        assert all(tokens == seqs for seqs, tokens in shapes), shapes  # no prompt token computed here
        rest = [o async for o in gen]
        assert rest[-1].outputs[0].token_ids == [1040, 1041, 1042]
        assert_idle(e)

    run(main())


def test_what_can_never_fit_fails_clearly():
    """A prompt larger than the whole KV cache is refused at once; a sequence
    that would outgrow it ends with "length" (the cache is the mock's
    max_model_len); max_num_seqs above the budget is refused as vLLM does."""

    async def main():
        e = engine(num_kv_blocks=4)  # 16 tokens
        with pytest.raises(ValueError, match="can never fit"):
            await e.generate(list(range(17)), SamplingParams(max_tokens=1), "huge").__anext__()
        outs = [o async for o in e.generate(list(range(10)), SamplingParams(max_tokens=100), "grows")]
        assert len(outs[-1].outputs[0].token_ids) == 7 and outs[-1].outputs[0].finish_reason == "length"
        assert_idle(e)
        with pytest.raises(ValueError, match="max_num_seqs"):
            engine(max_num_seqs=100, max_num_batched_tokens=64)

    run(main())


def test_gauges_and_kv_usage():
    async def main():
        e = engine(num_kv_blocks=100, max_num_seqs=2, decode_time_per_token=0.001)
        gens = [e.generate([i] * 8, SamplingParams(max_tokens=50), f"g{i}") for i in range(3)]
        firsts = [asyncio.ensure_future(g.__anext__()) for g in gens]
        await firsts[0]
        s = e.stats
        assert (s.num_requests_running, s.num_requests_waiting, s.running_requests) == (2, 1, 3)
        assert s.kv_cache_usage == s.kv_blocks_in_use / 100 and s.kv_blocks_in_use >= 4
        # Consumers that cancel abort their requests (running or waiting): everything is freed.
        firsts[2].cancel()
        await asyncio.gather(firsts[2], return_exceptions=True)
        await firsts[1]
        for g in gens[:2]:
            await g.aclose()
        assert e.stats.aborts_confirmed == 3 and e.stats.prefill_aborts == 1  # "g2" waited: still in prefill
        assert_idle(e)

    run(main())


def test_a_steps_outputs_come_in_chunks_with_the_loop_between():
    """As vLLM's AsyncLLM hands a step's outputs over (VLLM_V1_OUTPUT_PROC_CHUNK_SIZE):
    the consumers of a chunk run before the next chunk is made, so a kill that
    arrives during a big step's handling takes effect between chunks."""

    async def main():
        e = engine()
        e._chunk = 10
        last_unmade = []  # per output seen: whether the last request's token was still to make

        async def consume(i):
            async for _ in e.generate([i + 1], SamplingParams(max_tokens=1), f"c{i}"):
                last = e._running.get("c29")
                last_unmade.append(last is not None and not last.out)

        await asyncio.gather(*[consume(i) for i in range(30)])
        assert len(last_unmade) == 30
        # The first chunk's consumers ran before the third chunk was made.
        assert last_unmade[:10] == [True] * 10, last_unmade
        assert e.stats.running_requests == 0

    run(main())
