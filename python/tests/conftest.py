"""Make the in-tree package importable even without an editable install."""

import sys
from pathlib import Path

_PY = Path(__file__).resolve().parents[1]
if str(_PY) not in sys.path:
    sys.path.insert(0, str(_PY))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def nats_server_bin():
    """A nats-server binary built from go.mod's module (see natsserver.py)."""
    from natsserver import nats_server_binary

    return nats_server_binary()


@pytest.fixture(scope="module")
def nats_url():
    """A private embedded NATS server on an ephemeral port, kept for the module."""
    from dynamo_ctx import DistributedRuntime

    host = DistributedRuntime(nats_url="nats://127.0.0.1:0")
    yield host.nats_url
    host.shutdown()
