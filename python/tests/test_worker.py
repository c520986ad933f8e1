"""Workers as processes: migration after SIGKILL, and decode cancellation reaching a remote prefill."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from dynamo_ctx import Context, DistributedRuntime
from harness import HANG, Worker, child_env, expected_tokens, new_namespace
from helpers import run


async def start_mock_worker(nats_url, namespace, *args, mode="agg", name="worker"):
    """``python -m dynamo_ctx.worker`` serving model "mock", once it serves."""
    w = Worker(name, child_env(nats_url), namespace=namespace, mode=mode, model="mock", engine=None, args=args)
    return await w.ready_async()


def test_sigkill_mid_stream_migrates_to_second_worker(nats_url):
    async def main():
        space = new_namespace("w")
        args = ["--decode-time-per-token", "0.01", "--migration-limit", "2"]
        workers = [await start_mock_worker(nats_url, space, *args, name=f"worker{i}") for i in range(2)]
        try:
            rt = DistributedRuntime(nats_url=nats_url)
            client = await rt.endpoint(f"{space}.backend.generate").client(migration_limit=2)
            while len(client.instance_ids()) < 2:
                await client.wait_for_instances()
                await asyncio.sleep(0.05)
            ctx = Context("migrate-me")
            stream = await client.generate({"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 60}}, context=ctx)
            tokens = []
            victim = None
            async for item in stream:
                tokens.extend(item.data()["token_ids"])
                if victim is None and len(tokens) >= 10:
                    for w in workers:
                        if w.metrics()["dynamo_ctx_worker_running_requests"] == 1:
                            victim = w
                    assert victim is not None
                    victim.kill()
            assert tokens == expected_tokens([1, 2, 3], 60), "one continuous stream: no token lost or repeated"
            survivor = next(w for w in workers if w is not victim)
            await survivor.wait_log_async(r"New Request ID: migrate-me")
            rt.shutdown()
        finally:
            for w in workers:
                w.kill()

    run(main())


def test_decode_cancel_during_prefill_aborts_remote_prefill(nats_url):
    async def main():
        space = new_namespace("w")
        prefill = await start_mock_worker(nats_url, space, "--prefill-time-per-token", "0.01", mode="prefill", name="prefill")
        decode = await start_mock_worker(nats_url, space, mode="decode", name="decode")
        try:
            rt = DistributedRuntime(nats_url=nats_url)
            client = await rt.endpoint(f"{space}.backend.generate").client()
            await client.wait_for_instances()
            ctx = Context("cancel-in-prefill")
            # Keep the stream: dropping it would kill the request by itself.
            stream = await client.generate({"token_ids": list(range(2000)), "max_tokens": 50}, context=ctx)  # ~20 s of prefill
            await prefill.wait_log_async(r"New Prefill Request ID: cancel-in-prefill")
            ctx.kill()
            await prefill.wait_log_async(r"Aborted Prefill Request ID: cancel-in-prefill")
            m = prefill.metrics()
            assert m["dynamo_ctx_worker_aborts_confirmed_total"] == 1
            assert m["dynamo_ctx_worker_running_requests"] == 0
            assert m["dynamo_ctx_worker_kv_blocks_in_use"] == 0
            assert decode.metrics()["dynamo_ctx_worker_running_requests"] == 0
            assert [x async for x in stream] == []  # the killed stream just ends
            rt.shutdown()
        finally:
            decode.kill()
            prefill.kill()

    run(main())


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_worker_serves_and_aborts_on_either_event_loop(nats_url, event_loop):
    """The worker command runs on uvloop (the default when it is installed,
    as Dynamo's workers do) or on asyncio's own loop: a stream arrives whole,
    and a kill mid-stream aborts the engine, on both."""
    if event_loop == "uvloop":
        pytest.importorskip("uvloop")

    async def main():
        space = new_namespace("w")
        args = ["--decode-time-per-token", "0.005", "--event-loop", event_loop]
        worker = await start_mock_worker(nats_url, space, *args, "--log-level", "debug")
        try:
            await worker.wait_log_async("runs on " + ("uvloop" if event_loop == "uvloop" else "asyncio's event loop"))
            rt = DistributedRuntime(nats_url=nats_url)
            client = await rt.endpoint(f"{space}.backend.generate").client()
            await client.wait_for_instances()
            whole = [t async for item in await client.generate({"token_ids": [1, 2], "max_tokens": 20}) for t in item.data()["token_ids"]]
            assert whole == expected_tokens([1, 2], 20)
            ctx = Context(f"kill-on-{event_loop}")
            stream = await client.generate({"token_ids": [1, 2], "max_tokens": 10_000}, context=ctx)
            async for _ in stream:
                ctx.kill()
            await worker.wait_log_async(rf"Aborted Request ID: kill-on-{event_loop}")
            m = worker.metrics()
            assert m["dynamo_ctx_worker_aborts_confirmed_total"] == 1
            assert m["dynamo_ctx_worker_running_requests"] == 0
            rt.shutdown()
        finally:
            worker.kill()

    run(main())


def test_engine_death_hands_streams_over_and_exits_nonzero(nats_url):
    """A worker whose engine dies mid-stream logs it once, ends its streams without their
    final marker so that migration continues them on the other worker (token-exact), and
    exits with status 1 and one line saying why."""

    async def main():
        space = new_namespace("d")
        common = ["--decode-time-per-token", "0.005", "--prefill-time-per-token", "0"]
        healthy = await start_mock_worker(nats_url, space, *common, name="healthy")
        doomed = await start_mock_worker(nats_url, space, *common, "--mock-die-after-steps", "30", name="doomed")
        doomed_id = doomed.instance_id
        rt = DistributedRuntime(nats_url=nats_url)
        client = await rt.endpoint(f"{space}.backend.generate").client(migration_limit=2)
        while len(client.instance_ids()) < 2:
            await client.wait_for_instances()
            await asyncio.sleep(0.05)
        try:
            # The doomed worker takes every stream, then its engine dies at its 30th step.
            request = {"token_ids": [1, 2, 3], "stop_conditions": {"max_tokens": 80}}
            streams = [await client.direct(request, doomed_id, context=Context(f"dead-{i}")) for i in range(4)]

            async def tokens_of(stream):
                return [t async for item in stream for t in item.data()["token_ids"]]

            results = await asyncio.wait_for(asyncio.gather(*(tokens_of(s) for s in streams)), HANG)
            for tokens in results:
                assert tokens == expected_tokens([1, 2, 3], 80), "migrated token-exact"
            assert await doomed.wait_async(HANG) == 1  # and its output is read to the end
            text = doomed.log()
            assert text.count("the engine died: EngineDeadError") == 2, text  # the log line, and the exit's one line
            assert doomed.lines[-1].startswith("python -m dynamo_ctx.worker: the engine died: EngineDeadError"), doomed.lines[-1]
            for i in range(4):
                await healthy.wait_log_async(rf"New Request ID: dead-{i}")
        finally:
            rt.shutdown()
            doomed.kill()
            healthy.kill()

    run(main())


def test_worker_publishes_the_librarys_model_card(tmp_path):
    """The worker's instance metadata is the model card the library builds and checks
    (go/modelcard): the keys frontends read, and the checksum of the model directory's text
    files, which follows them; a card the library refuses is never published."""
    from dynamo_ctx import _native
    from dynamo_ctx.cli import worker

    d = tmp_path / "model"
    shutil.copytree(Path(__file__).resolve().parents[2] / "go" / "frontend" / "testdata" / "model", d)
    model = worker.Model("tiny", str(d), 512, 8)
    card = worker.model_card(model, "decode", 2)
    assert card == json.loads(_native.model_card("tiny", "decode", 2, max_num_seqs=8, max_model_len=512, model_path=str(d)))
    assert list(card) == ["model", "mode", "migration_limit", "max_num_seqs", "max_model_len", "model_path", "text_checksum"]
    assert card["model_path"] == str(d) and card["text_checksum"].startswith("sha256:")
    assert worker.model_card(worker.Model("tiny", None, None), "agg", 0) == {"model": "tiny", "mode": "agg", "migration_limit": 0}

    (d / "chat_template.jinja").write_text("{{ messages }}")  # a new revision of the text, in place
    assert worker.model_card(model, "decode", 2)["text_checksum"] != card["text_checksum"]
    with pytest.raises(ValueError, match="mode"):
        worker.model_card(model, "aggregated", 0)
    with pytest.raises(OSError, match="tokenizer.json"):
        worker.model_card(worker.Model("tiny", str(tmp_path / "none"), None), "agg", 0)


def test_a_worker_at_its_default_level_logs_nothing_per_request(nats_url):
    """vLLM's server logs one line per request (its access log, which our
    frontend's counterpart is); the worker adds none at INFO. Its "New Request
    ID" line is DEBUG, shown with a per-logger level in DYN_LOG's form."""

    async def main():
        space = new_namespace("w")
        quiet = await Worker("quiet", child_env(nats_url, DYN_LOG="info"), namespace=space, mode="agg", model="mock",
                             engine=None).ready_async()
        told = await Worker("told", child_env(nats_url, DYN_LOG="INFO,dynamo_ctx.backends.vllm=debug"), namespace=space,
                            mode="agg", model="mock", engine=None).ready_async()
        try:
            rt = DistributedRuntime(nats_url=nats_url)
            client = await rt.endpoint(f"{space}.backend.generate").client()
            while len(client.instance_ids()) < 2:
                await client.wait_for_instances()
                await asyncio.sleep(0.05)
            before = quiet.log().count("\n")
            for i in range(20):
                for instance in client.instance_ids():
                    stream = await client.direct({"token_ids": [1, 2], "max_tokens": 2}, instance, context=Context(f"quiet-{i}"))
                    assert [item.data() async for item in stream]
            await told.wait_log_async(r"New Request ID: quiet-19(?: |$)")
            assert quiet.log().count("\n") == before, quiet.log()
            assert quiet.log_count("New Request ID") == 0
            assert told.log_count(r"New Request ID: quiet-\d+") == 20
            rt.shutdown()
        finally:
            quiet.kill()
            told.kill()

    run(main())


def test_the_vllm_worker_caches_vllms_environment(monkeypatch):
    """Once its engine runs, the worker makes vLLM read its environment variables
    once (``vllm.envs.enable_envs_cache``), as vLLM's engine core does; a vLLM
    without that function is left as it is."""
    import sys
    import types

    from dynamo_ctx.cli.worker import cache_vllm_environment

    calls = []
    envs = types.ModuleType("vllm.envs")
    envs.enable_envs_cache = lambda: calls.append(1)  # type: ignore[attr-defined]
    vllm = types.ModuleType("vllm")
    vllm.envs = envs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)
    cache_vllm_environment()
    assert calls == [1]
    del envs.enable_envs_cache  # type: ignore[attr-defined]
    cache_vllm_environment()  # nothing to call: no error
    assert calls == [1]
