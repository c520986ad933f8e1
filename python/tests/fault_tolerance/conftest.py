"""End-to-end fault-tolerance tests: a frontend and mock workers as real processes.

Each test gets a fresh stack (harness.Stack) on its own NATS host: an embedded
NATS server on a free port, in a process of its own, whose URL is passed to the
frontend and the workers as NATS_SERVER, so these tests never touch
nats://127.0.0.1:4222. Test modules reach the harness through the ``stack``
fixture; each process's log file is in the test's tmp_path (the tests' conftest
prints the logs of a failed test).
"""

from __future__ import annotations

import pytest

from harness import Stack, dump_logs


@pytest.fixture
def stack(tmp_path):
    """A fresh NATS host for this test; call ``stack.start(...)`` to add a frontend and workers."""
    s = Stack(log_dir=tmp_path / "logs")
    try:
        yield s
    finally:
        complaints = s.close()
        if complaints:
            print(dump_logs([s.nats_host, *s.procs]))
            pytest.fail("; ".join(complaints))
