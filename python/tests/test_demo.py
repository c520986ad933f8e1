"""``python -m dynamo_ctx.demo`` (what ``make demo`` runs): two at once on one
machine both succeed, each on its own NATS address, namespace and request ids."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PY_DIR = Path(__file__).resolve().parents[1]

pytest.importorskip("openai")


def test_two_demos_side_by_side():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PY_DIR), os.environ.get("PYTHONPATH")])))
    env.pop("NATS_SERVER", None)
    procs = [subprocess.Popen([sys.executable, "-m", "dynamo_ctx.demo"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(out)
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
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PY_DIR), os.environ.get("PYTHONPATH")])),
               NATS_SERVER="nats://127.0.0.1:0")
    r = subprocess.run([sys.executable, "-m", "dynamo_ctx.demo"], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    url = re.search(r"NATS at (\S+)", r.stdout).group(1)
    assert not url.endswith(":0"), url
