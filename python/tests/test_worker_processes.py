"""Workers as processes: migration after SIGKILL, and decode cancellation reaching a remote prefill."""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import socket
import sys
import uuid
from pathlib import Path


import pytest

from dynamo_ctx import Context, DistributedRuntime
from helpers import HANG, run

HERE = Path(__file__).resolve().parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """``python -m dynamo_ctx.worker`` in a subprocess; its log lines are collected."""

    def __init__(self, proc, port):
        self.proc, self.port, self.lines = proc, port, []
        self._reader = asyncio.ensure_future(self._read())
        self._waiters = []

    @classmethod
    async def start(cls, nats_url, namespace, *args):
        port = free_port()
        env = dict(os.environ, NATS_SERVER=nats_url, PYTHONPATH=str(HERE.parent))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dynamo_ctx.worker", "--namespace", namespace, "--metrics-port", str(port), *args,
            env=env, stderr=asyncio.subprocess.PIPE,
        )
        w = cls(proc, port)
        await w.wait_log(r"serving \S+ as instance")
        return w

    async def _read(self):
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line.decode())
            for pattern, fut in list(self._waiters):
                if re.search(pattern, self.lines[-1]) and not fut.done():
                    fut.set_result(self.lines[-1])

    async def wait_log(self, pattern):
        for line in self.lines:
            if re.search(pattern, line):
                return line
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((pattern, fut))
        return await asyncio.wait_for(fut, HANG)

    async def metrics(self):
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = await reader.read()
        writer.close()
        body = data.split(b"\r\n\r\n", 1)[1].decode()
        out = collections.defaultdict(float)  # a counter with no series yet reads 0
        for line in body.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                bare = name.split("{")[0]
                out[bare] = out.get(bare, 0.0) + float(value)  # summed over reasons and outcomes
        return out

    async def kill(self):
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        self._reader.cancel()


def expected_tokens(prompt_len, n, seed=1000, vocab=32000):
    return [(seed + prompt_len + i) % vocab for i in range(n)]


def test_sigkill_mid_stream_migrates_to_second_worker(nats_url):
    async def main():
        space = f"w{uuid.uuid4().hex[:8]}"
        args = ["--mode", "agg", "--model", "mock", "--decode-time-per-token", "0.01", "--migration-limit", "2"]
        workers = [await Worker.start(nats_url, space, *args) for _ in range(2)]
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
                        if (await w.metrics())["dynamo_ctx_worker_running_requests"] == 1:
                            victim = w
                    assert victim is not None
                    await victim.kill()
            assert tokens == expected_tokens(3, 60), "one continuous stream: no token lost or repeated"
            survivor = next(w for w in workers if w is not victim)
            await survivor.wait_log(r"New Request ID: migrate-me")
            rt.shutdown()
        finally:
            for w in workers:
                await w.kill()

    run(main())


def test_decode_cancel_during_prefill_aborts_remote_prefill(nats_url):
    async def main():
        space = f"w{uuid.uuid4().hex[:8]}"
        prefill = await Worker.start(nats_url, space, "--mode", "prefill", "--model", "mock", "--prefill-time-per-token", "0.01")
        decode = await Worker.start(nats_url, space, "--mode", "decode", "--model", "mock")
        try:
            rt = DistributedRuntime(nats_url=nats_url)
            client = await rt.endpoint(f"{space}.backend.generate").client()
            await client.wait_for_instances()
            ctx = Context("cancel-in-prefill")
            # Keep the stream: dropping it would kill the request by itself.
            stream = await client.generate({"token_ids": list(range(2000)), "max_tokens": 50}, context=ctx)  # ~20 s of prefill
            await prefill.wait_log(r"New Prefill Request ID: cancel-in-prefill")
            ctx.kill()
            await prefill.wait_log(r"Aborted Prefill Request ID: cancel-in-prefill")
            m = await prefill.metrics()
            assert m["dynamo_ctx_worker_aborts_confirmed_total"] == 1
            assert m["dynamo_ctx_worker_running_requests"] == 0
            assert m["dynamo_ctx_worker_kv_blocks_in_use"] == 0
            assert (await decode.metrics())["dynamo_ctx_worker_running_requests"] == 0
            assert [x async for x in stream] == []  # the killed stream just ends
            rt.shutdown()
        finally:
            await decode.kill()
            await prefill.kill()

    run(main())


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_worker_serves_and_aborts_on_either_event_loop(nats_url, event_loop):
    """The worker command runs on uvloop (the default when it is installed,
    as Dynamo's workers do) or on asyncio's own loop: a stream arrives whole,
    and a kill mid-stream aborts the engine, on both."""
    if event_loop == "uvloop":
        pytest.importorskip("uvloop")

    async def main():
        space = f"w{uuid.uuid4().hex[:8]}"
        args = ["--mode", "agg", "--model", "mock", "--decode-time-per-token", "0.005", "--event-loop", event_loop]
        worker = await Worker.start(nats_url, space, *args, "--log-level", "debug")
        try:
            await worker.wait_log("runs on " + ("uvloop" if event_loop == "uvloop" else "asyncio's event loop"))
            rt = DistributedRuntime(nats_url=nats_url)
            client = await rt.endpoint(f"{space}.backend.generate").client()
            await client.wait_for_instances()
            whole = [t async for item in await client.generate({"token_ids": [1, 2], "max_tokens": 20}) for t in item.data()["token_ids"]]
            assert whole == expected_tokens(2, 20)
            ctx = Context(f"kill-on-{event_loop}")
            stream = await client.generate({"token_ids": [1, 2], "max_tokens": 10_000}, context=ctx)
            async for _ in stream:
                ctx.kill()
            await worker.wait_log(rf"Aborted Request ID: kill-on-{event_loop}")
            m = await worker.metrics()
            assert m["dynamo_ctx_worker_aborts_confirmed_total"] == 1
            assert m["dynamo_ctx_worker_running_requests"] == 0
            rt.shutdown()
        finally:
            await worker.kill()

    run(main())


def test_engine_death_hands_streams_over_and_exits_nonzero(nats_url):
    """A worker whose engine dies mid-stream logs it once, ends its streams without their
    final marker so that migration continues them on the other worker (token-exact), and
    exits with status 1 and one line saying why."""

    async def main():
        space = f"d{uuid.uuid4().hex[:8]}"
        common = ["--mode", "agg", "--model", "mock", "--decode-time-per-token", "0.005", "--prefill-time-per-token", "0"]
        healthy = await Worker.start(nats_url, space, *common)
        doomed = await Worker.start(nats_url, space, *common, "--mock-die-after-steps", "30")
        doomed_id = int(re.search(r"as instance (\d+)", await doomed.wait_log(r"serving \S+ as instance")).group(1))
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
                assert tokens == expected_tokens(3, 80), "migrated token-exact"
            assert await asyncio.wait_for(doomed.proc.wait(), HANG) == 1
            await doomed._reader
            text = "".join(doomed.lines)
            assert text.count("the engine died: EngineDeadError") == 2, text  # the log line, and the exit's one line
            assert doomed.lines[-1].startswith("python -m dynamo_ctx.worker: the engine died: EngineDeadError"), doomed.lines[-1]
            for i in range(4):
                await healthy.wait_log(rf"New Request ID: dead-{i}")
        finally:
            rt.shutdown()
            await doomed.kill()
            await healthy.kill()

    run(main())
