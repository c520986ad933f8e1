"""The C ABI's log queue (docs/c-abi.md): its fd and records, in a fresh
interpreter (the log queue is per process)."""

from __future__ import annotations

from typing import Tuple

from c_abi import (
    DC_EAGAIN,
    DC_EINTERNAL,
    DC_EINVAL,
    DC_ERANGE,
    DC_OK,
    expect,
    ffi,
    lib_fixture,  # noqa: F401 - the fixture "lib"
    load,
    ok,
    readable,
)
from harness import HANG
from selftest_library import run_in_fresh_interpreter


# ---------------------------------------------------------------------------
# Logging (in a fresh interpreter: the log queue is per process; on the test
# library, whose dc_selftest_panic makes a record at will)
# ---------------------------------------------------------------------------


def _log_next(lib, cap: int) -> Tuple[int, int, int, bytes]:
    level = ffi.new("int *", -1)
    n = ffi.new("size_t *")
    buf = ffi.new("char[]", max(cap, 1))
    rc = lib.dc_log_next(level, buf if cap else ffi.NULL, cap, n)
    return rc, level[0], n[0], ffi.string(buf) if rc == DC_OK else b""


def _scenario_log_records() -> None:
    lib = load()
    fdp = ffi.new("int *")
    ok(lib, lib.dc_log_fd(fdp))
    fd = fdp[0]
    # Nothing queued at the default level (30) in a process that did nothing yet.
    assert not readable(fd)
    rc, _, _, _ = _log_next(lib, 256)
    expect(lib, rc, DC_EAGAIN, "dc_log_next")

    ok(lib, lib.dc_log_set_level(10))
    assert lib.dc_selftest_panic() == DC_EINTERNAL
    assert readable(fd, HANG)
    rc, _, needed, _ = _log_next(lib, 4)  # tiny buffer: the record stays for the retry
    expect(lib, rc, DC_ERANGE, "dc_log_next")
    assert needed > 4
    rc, _, again, _ = _log_next(lib, 0)
    expect(lib, rc, DC_ERANGE, "dc_log_next")
    assert again == needed
    rc, level, n, msg = _log_next(lib, needed + 1)
    ok(lib, rc)
    assert level == 40 and n == needed == len(msg)
    assert b"panic" in msg and b"dc_selftest_panic" in msg
    rc, _, _, _ = _log_next(lib, 256)
    assert rc == DC_EAGAIN
    assert not readable(fd)

    # Records below the level are not queued; at or above it they are.
    ok(lib, lib.dc_log_set_level(50))
    assert lib.dc_selftest_panic() == DC_EINTERNAL
    assert not readable(fd)
    assert _log_next(lib, 256)[0] == DC_EAGAIN
    ok(lib, lib.dc_log_set_level(30))
    assert lib.dc_selftest_panic() == DC_EINTERNAL
    assert lib.dc_selftest_panic() == DC_EINTERNAL
    assert readable(fd)
    first, second = _log_next(lib, 4096), _log_next(lib, 4096)
    assert first[0] == second[0] == DC_OK and first[1] == second[1] == 40
    assert _log_next(lib, 4096)[0] == DC_EAGAIN
    assert not readable(fd)


def _scenario_log_fd_readable_after_erange() -> None:
    lib = load()
    fdp = ffi.new("int *")
    ok(lib, lib.dc_log_fd(fdp))
    ok(lib, lib.dc_log_set_level(10))
    assert lib.dc_selftest_panic() == DC_EINTERNAL
    assert readable(fdp[0], HANG)
    rc, _, needed, _ = _log_next(lib, 4)
    assert rc == DC_ERANGE
    # The record is still waiting for dc_log_next, so by dc_log_fd's contract
    # ("readable whenever log records are waiting") the fd must stay readable.
    assert readable(fdp[0]), "log fd not readable while a record waits after DC_ERANGE"
    assert _log_next(lib, needed + 1)[0] == DC_OK


def test_log_records(selftest_library):
    run_in_fresh_interpreter("test_c_abi_logging", "_scenario_log_records", selftest_library)


def test_log_fd_stays_readable_after_erange(selftest_library):
    run_in_fresh_interpreter("test_c_abi_logging", "_scenario_log_fd_readable_after_erange", selftest_library)


def test_log_calls_in_process(lib):
    fd = ffi.new("int *", -1)
    ok(lib, lib.dc_log_fd(fd))
    assert fd[0] >= 0
    again = ffi.new("int *")
    ok(lib, lib.dc_log_fd(again))
    assert again[0] == fd[0]  # one fd for the life of the library
    expect(lib, lib.dc_log_fd(ffi.NULL), DC_EINVAL, "dc_log_fd")
