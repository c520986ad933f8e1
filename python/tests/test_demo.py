"""``python -m dynamo_ctx.demo`` (what ``make demo`` runs): two at once on one
machine both succeed, each on its own NATS address, namespace and request ids."""

from __future__ import annotations

import re
import sys

import pytest

from harness import Proc, child_env

pytest.importorskip("openai")

DEMO = [sys.executable, "-m", "dynamo_ctx.demo"]


def test_two_demos_side_by_side():
    procs = [Proc(f"demo{i}", DEMO, child_env()) for i in range(2)]
    outs = []
    for p in procs:
        p.wait(180)
        outs.append(p.log())
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
        assert "every cancellation confirmed, every resource freed" in out, out
    urls = [re.search(r"NATS at (\S+)", out).group(1) for out in outs]
    namespaces = [re.search(r"namespace (\S+),", out).group(1) for out in outs]
    assert urls[0] != urls[1] and not any(u.endswith(":4222") for u in urls), urls
    assert namespaces[0] != namespaces[1], namespaces


def test_demo_children_use_the_address_it_prints():
    """NATS_SERVER=nats://127.0.0.1:0 names a free port: the demo prints the
    port it got and its children join that one (they would fail otherwise)."""
    demo = Proc("demo", DEMO, child_env("nats://127.0.0.1:0"))
    assert demo.wait(180) == 0, demo.log()
    url = re.search(r"NATS at (\S+)", demo.log()).group(1)
    assert not url.endswith(":0"), url
