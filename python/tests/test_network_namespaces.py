"""Stacks of one user in different network namespaces, each on the default NATS address.

Each namespace has its own 127.0.0.1:4222, served by the embedded server of its own
first process with a token of its own. The token file is named by the namespace too
(docs/security.md), so one namespace's stack starting or stopping never replaces or
removes the file another namespace's server is reached with.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import HANG, TESTS_DIR, Proc, child_env, private_network

ROUNDS = 20


class Namespace:
    """netns_stack.py running in a network namespace of its own."""

    def __init__(self, name: str, prefix: list, runtime_dir: Path) -> None:
        import sys

        env = child_env(DYNAMO_CTX_RUNTIME_DIR=str(runtime_dir))
        self.proc = Proc(name, [*prefix, sys.executable, str(TESTS_DIR / "netns_stack.py")], env,
                         stdin=True, events=True)
        self.name = name

    def do(self, op: str, where: str) -> None:
        assert self.proc.proc.stdin is not None
        self.proc.proc.stdin.write(op + "\n")
        self.proc.proc.stdin.flush()
        ev = self.proc.event("done", timeout=2 * HANG)
        assert ev["op"] == op
        assert ev["ok"], f"{where}: namespace {self.name}, {op}: {ev['error']}"

    def close(self) -> None:
        self.proc.close_stdin()
        assert self.proc.wait(HANG) == 0, self.proc.tail()


def test_namespaces_keep_their_own_bus_credential(tmp_path):
    """Two stacks on the default address, in two network namespaces of one user (one
    runtime directory), start and stop in a loop. In each round one namespace's frontend
    hosts its server while the other's stack starts, serves, stops and starts again;
    then a new worker in the first namespace must connect (before the token file was
    named by the namespace, it read the other namespace's token and was refused with
    Authorization Violation). Every new process connects in every round, and no token
    file is left behind."""
    prefix = private_network()
    if not prefix:
        pytest.skip("this machine does not allow a private network namespace (unshare -rn)")
    runtime = tmp_path / "rt"
    spaces = [Namespace("ns-a", prefix, runtime), Namespace("ns-b", prefix, runtime)]
    try:
        for r in range(ROUNDS):
            first, other = spaces if r % 2 == 0 else spaces[::-1]
            where = f"round {r + 1}"
            first.do("frontend", where)
            other.do("frontend", where)
            other.do("worker", where)
            other.do("stop", where)
            other.do("frontend", where)  # the other namespace's server again, a new token
            first.do("worker", where)  # a new process beside the first frontend
            first.do("stop", where)
            other.do("worker", where)  # and one beside the other's, after the first left
            other.do("stop", where)
    finally:
        for ns in spaces:
            ns.close()
    left = sorted(p.name for p in runtime.iterdir()) if runtime.exists() else []
    assert left == [], f"token files left behind: {left}"
