"""The engine's own load (waiting requests, KV cache usage), from the engine to the load
reports a worker's endpoint publishes on ``dc.load.<path>`` (docs/design.md, section 10):
the sink between them, the mock engine's reports, and the served endpoint's."""

from __future__ import annotations

import asyncio
import json
import math
import secrets

import pytest

from dynamo_ctx import DistributedRuntime
from dynamo_ctx._lib import native
from dynamo_ctx.backends.engineload import LoadSink
from dynamo_ctx.mocker import MockAsyncLLM, MockEngineArgs, SamplingParams
from harness import NatsHost, Subscription, child_env, new_namespace
from helpers import run


def test_sink_hands_over_changes_only():
    """Figures reported before the endpoint serves are kept for it; the same figures are not
    sent twice; a target that fails does not reach the engine; several engines add up."""
    sink, got = LoadSink(), []
    sink.report(2, 0.5)
    sink.attach(lambda w, kv: got.append((w, kv)))
    sink.report(2, 0.5)
    sink.report(0, 0.25)
    assert got == [(2, 0.5), (0, 0.25)]
    sink.report(1, 0.75, engine=1)
    assert got[-1] == (1, 0.75)

    def broken(w, kv):
        raise RuntimeError("the endpoint is gone")

    sink.attach(broken)
    sink.report(3, 0.1)  # no exception


def test_mock_engine_reports_waiting_and_kv_usage():
    """With a KV cache that holds one of two long prompts, the second waits: the sink sees
    one waiting and the first's blocks in use, then, idle, nothing of either."""

    async def main():
        e = MockAsyncLLM(MockEngineArgs(prefill_time_per_token=0.0, decode_time_per_token=0.002, block_size=4,
                                        num_kv_blocks=8, max_num_seqs=4))
        got = []
        e.load_sink = LoadSink()
        e.load_sink.attach(lambda w, kv: got.append((w, kv)))

        async def one(rid):
            return [o async for o in e.generate(list(range(1, 21)), SamplingParams(max_tokens=4), rid)]

        await asyncio.gather(one("a"), one("b"))
        assert (1, 5 / 8) in got, got  # a's 20 prompt tokens hold 5 blocks; b waits for them
        assert got[-1] == (0, 0.0), got

    run(main())


def _card(max_num_seqs: int) -> bytes:
    return native().model_card("m", "agg", 0, max_num_seqs=max_num_seqs).encode()


def _next_report(sub: Subscription, instance: int) -> dict:
    while True:
        rep = json.loads(sub.next())
        if rep["instance"] == instance:
            return rep


@pytest.fixture(scope="module")
def nats_url():
    """A NATS host whose token the test knows (Subscription reads the bus): the URL with it."""
    token = secrets.token_hex(16)
    host = NatsHost(child_env(NATS_TOKEN=token))
    yield host.url.replace("://", f"://{token}@", 1)
    host.stop()


def test_served_endpoint_publishes_the_engine_load(nats_url):
    """Endpoint.set_engine_load: the figures go out in the endpoint's next load report,
    and None leaves one out; busy_refusals is the endpoint's count (none here)."""

    async def main():
        rt = DistributedRuntime(nats_url=nats_url)
        path = f"{new_namespace('load')}.backend.generate"
        ep = rt.endpoint(path)
        ep.set_engine_load(1, 0.1)  # not served yet: nothing, no error

        async def handler(request):
            yield request

        with Subscription(nats_url, f"dc.load.{path}") as sub:
            task = asyncio.ensure_future(ep.serve_endpoint(handler, metadata=json.loads(_card(4))))
            instance = await ep.serving()
            ep.set_engine_load(3, 0.5)
            rep = _next_report(sub, instance)
            assert rep == {"instance": instance, "gen": rep["gen"], "running": 0, "capacity": 4, "free": 4,
                           "waiting": 3, "kv_usage": 0.5}
            await asyncio.sleep(0.15)  # past the load interval: the next change is published at once
            ep.set_engine_load(None, 0.25)
            rep = _next_report(sub, instance)
            assert "waiting" not in rep and rep["kv_usage"] == 0.25
            with pytest.raises(ValueError):
                ep.set_engine_load(0, math.nan)
            assert ep.busy_refusals() == 0
        rt.shutdown()
        await asyncio.wait_for(task, 10)
        ep.set_engine_load(1, 0.1)  # no longer served: nothing
        assert ep.busy_refusals() == 0

    run(main())
