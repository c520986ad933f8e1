"""The names and codes the Python API uses are the native library's: the
endpoint path and name rule, the reason and error names, the route codes, the
version, and one table from error codes to exceptions, used by the native
module too."""

from __future__ import annotations

import asyncio
import re

import pytest

import dynamo_ctx
from dynamo_ctx import Context, DistributedRuntime, RuntimeClosed
from dynamo_ctx._lib import native
from dynamo_ctx.runtime import _exception_for
from harness import HANG


def test_version_is_the_librarys():
    import importlib.metadata

    assert dynamo_ctx.__version__ == native().version()
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", dynamo_ctx.__version__)
    assert importlib.metadata.version("dynamo-ctx") == dynamo_ctx.__version__


def test_reason_names_are_the_librarys():
    lib = native()
    assert lib.REASON_NAMES[0] is None
    assert lib.REASON_NAMES[lib.REASON_KILL] == "kill"
    assert lib.REASON_NAMES[lib.REASON_SHUTDOWN] == "shutdown"
    c = Context("r1")
    c._cancel(lib.STOPPED, lib.REASON_DEADLINE)
    assert c.reason() == "deadline"


def test_error_names_and_codes():
    lib = native()
    for code, name in lib.ERROR_NAMES.items():
        assert getattr(lib, name) == code
    assert lib.ERROR_NAMES[lib.ECLOSED] == "ECLOSED"


def test_route_codes():
    lib = native()
    assert (lib.ROUTE_ROUND_ROBIN, lib.ROUTE_RANDOM, lib.ROUTE_DIRECT) == (0, 1, 2)


@pytest.mark.parametrize(
    "path",
    ["a.b", "a.b.c.d", "a..c", "a.*.c", "a.b.>", "a.b c.d", "a.b\u00a0c.d", "a.b.\x01", ""],
)
def test_endpoint_path_rule(path):
    with pytest.raises(ValueError):
        native().endpoint_path_check(path)


@pytest.mark.parametrize("name", ["", "a.b", "a*", ">", "a b", "a\u2003b", "a\x7f"])
def test_endpoint_name_rule_in_the_api(name):
    async def main():
        rt = DistributedRuntime(nats_url="nats://127.0.0.1:0")
        try:
            with pytest.raises(ValueError, match="invalid namespace name"):
                rt.namespace(name)
            with pytest.raises(ValueError, match="invalid component name"):
                rt.namespace("ns").component(name)
            with pytest.raises(ValueError, match="invalid endpoint name"):
                rt.namespace("ns").component("c").endpoint(name)
        finally:
            rt.shutdown()

    asyncio.run(asyncio.wait_for(main(), HANG))


def test_valid_names_accepted():
    native().endpoint_path_check("dyn-amo.back_end.générer")
    native().endpoint_name_check("back_end-2")


def test_one_exception_table():
    lib = native()
    assert isinstance(_exception_for(lib.ECLOSED, "closed"), RuntimeClosed)
    assert isinstance(_exception_for(lib.EINVAL, "bad"), ValueError)
    io = _exception_for(lib.EIO, "io")
    assert isinstance(io, OSError) and isinstance(io, RuntimeError), "as the native module and the streams raised it"
    assert str(io) == "io", "the code is an attribute, not text"
    assert (io.code, io.code_name) == (lib.EIO, "EIO")
    assert type(_exception_for(lib.ECONNECT, "no")) is RuntimeError
    unknown = _exception_for(12345, "unknown")
    assert type(unknown) is RuntimeError and unknown.code_name == "EUNKNOWN"


def test_native_module_raises_through_the_table():
    # A bad handle from the native module is the table's ValueError.
    with pytest.raises(ValueError, match="bad handle"):
        native().queue_free(5)
    # DC_ECLOSED from the native module is RuntimeClosed, as from a stream.
    rt = DistributedRuntime(nats_url="nats://127.0.0.1:0")
    h = rt._handle
    rt.shutdown()
    with pytest.raises(RuntimeClosed):
        native().endpoint_serve(h, "ns.c.e")
