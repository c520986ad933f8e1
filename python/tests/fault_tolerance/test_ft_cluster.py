"""A real three-node NATS cluster (nats-server processes on loopback): the frontend on node A,
workers on nodes B and C; node B SIGKILLed mid-traffic. The streams in flight are direct TCP
connections and keep flowing, the workers on B fail over to the surviving nodes and
re-announce, and new requests succeed.
"""

from __future__ import annotations

import asyncio

import pytest

from harness import NatsCluster, check_streams, stream_completion, streams_through_fault

pytestmark = pytest.mark.slow

STREAMS = 64
MAX_TOKENS = 100
DECODE = 0.02


def prompt_of(i: int) -> str:
    return f"cluster {i} " + "y" * (i % 19)


PROMPTS = [prompt_of(i) for i in range(STREAMS)]


@pytest.fixture
def cluster(nats_server_bin, tmp_path):
    c = NatsCluster(3, log_dir=tmp_path / "logs").start()
    try:
        yield c
    finally:
        c.stop()


async def _traffic(stack, fault):
    results, recovered, _ = await streams_through_fault(stack, fault, PROMPTS, MAX_TOKENS, "cl", "after the node")
    return results, recovered


def test_cluster_node_under_workers_sigkilled(stack, cluster):
    a, b, c = cluster.nodes
    # Each process is given its own node only; the client learns the others from the cluster.
    stack.start([
        {"decode": DECODE, "env": {"NATS_SERVER": b.url}},
        {"decode": DECODE, "env": {"NATS_SERVER": c.url}},
        {"decode": DECODE, "env": {"NATS_SERVER": b.url}},
    ], frontend=False)
    stack.env["NATS_SERVER"] = a.url
    stack.start([], migration_limit=2)

    results, recovered = asyncio.run(_traffic(stack, b.kill))
    check_streams(stack, PROMPTS, MAX_TOKENS, results, recovered, "cluster node B SIGKILLed", fault="node death")

    # Every worker is still there (the two on B re-announced through A or C) and serves.
    stack.frontend.wait_instances(3)
    for w in stack.workers:
        assert w.running(), w.name
    hp = stack.frontend.host_port

    async def more():
        return await asyncio.gather(*[
            stream_completion(hp, stack.model, prompt_of(i), 20, stack.new_id("post")) for i in range(12)
        ])

    for i, r in enumerate(asyncio.run(more())):
        assert r.status == 200 and r.done and r.text == stack.expected_text(prompt_of(i), 20), r
