"""Make the in-tree package importable even without an editable install; fixtures
every test module may use; the logs of a failed test's processes."""

import sys
from pathlib import Path

_PY = Path(__file__).resolve().parents[1]
if str(_PY) not in sys.path:
    sys.path.insert(0, str(_PY))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def nats_server_bin():
    """A nats-server binary built from go.mod's module (see harness/nats.py)."""
    from harness import nats_server_binary

    return nats_server_binary()


@pytest.fixture(scope="session")
def selftest_library():
    """The test library (``build.py --selftest``: the shipped library plus the
    panic self-test), built once per session; see selftest_library.py."""
    from selftest_library import build

    return build()


@pytest.fixture(scope="module")
def nats_url():
    """A private embedded NATS server on an ephemeral port, kept for the module."""
    from dynamo_ctx import DistributedRuntime

    host = DistributedRuntime(nats_url="nats://127.0.0.1:0")
    yield host.nats_url
    host.shutdown()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture(autouse=True)
def _process_logs(request):
    """After each test: the logs of the processes it started (harness.Proc) when it
    failed, and a stop (SIGTERM, then SIGKILL) for any it left running."""
    from harness import STARTED, dump_logs, keep_logs

    mark = len(STARTED)
    yield
    mine = STARTED[mark:]
    del STARTED[mark:]
    for p in mine:
        p.stop()
    rep = getattr(request.node, "rep_call", None)
    if mine and (rep is None or rep.failed):
        keep_logs()
        print(dump_logs(mine))
