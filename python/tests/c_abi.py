"""What the tests of the C ABI (python/tests/test_c_abi*.py) share: the
declarations, the hand-typed DC_* values, the loaded library, and the small
helpers a C user would write once.

The C ABI of the native library (docs/c-abi.md) is driven directly with cffi.
Everything in those tests is written the way a C user would write it from the header and
the doc alone: the declarations are the shipped header's (include/dynamo_ctx.h,
read as a C user's #include would), the DC_* values used are typed in by hand
from the doc (one test checks them against the header), handles are plain
integers, and readiness is checked with select() on the fds the library hands
out. Nothing here goes through the ``dynamo_ctx._native`` Python module.

The library is loaded lazily (on the first test that needs it, never at
collection) and never unloaded: a Go runtime cannot be unloaded, so the lib
object lives in a module global for the life of the process.
"""

from __future__ import annotations

import gc
import os
import select
import threading
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

cffi = pytest.importorskip("cffi")

import dynamo_ctx  # noqa: E402 - importing the package does not load the library
from selftest_library import ENV as SELFTEST_ENV  # noqa: E402

PACKAGE_DIR = Path(dynamo_ctx.__file__).resolve().parent
LIB_PATH = PACKAGE_DIR / "_native.abi3.so"
HEADER_PATH = PACKAGE_DIR / "include" / "dynamo_ctx.h"  # the public header, shipped
SERVICES_HEADER_PATH = HEADER_PATH.parent / "dynamo_ctx_services.h"  # the one it includes, shipped beside it
GENERATED_HEADER_PATH = PACKAGE_DIR / "_native.abi3.h"  # cgo's, internal (source tree only)

# ---------------------------------------------------------------------------
# Declarations: the shipped header itself, as a C user's #include gives them
# ---------------------------------------------------------------------------


def header_cdef(text: str) -> str:
    """The header as cffi's cdef takes it: its declarations, without the
    preprocessor lines and the C++ ``extern "C"`` guard (cdef has neither)."""
    out, in_cplusplus = [], False
    for line in text.splitlines():
        directive = line.strip()
        if directive.startswith("#ifdef __cplusplus"):
            in_cplusplus = True
        elif directive.startswith("#"):
            in_cplusplus = in_cplusplus and not directive.startswith("#endif")
        elif not in_cplusplus:
            out.append(line)
    return "\n".join(out)


def header_text() -> str:
    """The shipped headers' text: dynamo_ctx.h, then the one it includes
    (what a C user's ``#include "dynamo_ctx.h"`` declares)."""
    return HEADER_PATH.read_text("utf-8") + "\n" + SERVICES_HEADER_PATH.read_text("utf-8")


# The values a C user relies on, typed in by hand from docs/c-abi.md (the
# errno-like codes, the states, the reasons) as plain module-level names, like
# a C user's #include gives; test_enum_values_match_the_header checks them
# against the header.
DC_OK, DC_ENOENT, DC_EIO, DC_EBADF, DC_EAGAIN, DC_EEXIST, DC_EINVAL, DC_ERANGE = 0, 2, 5, 9, 11, 17, 22, 34
DC_EINTERNAL = 1000
DC_ECLOSED = 1005
DC_STATUS_PATH_MAX = 64  # a buffer that holds any path of a status listener
DC_LIVE, DC_STOPPED, DC_KILLED = 0, 1, 2
DC_STATE_MASK, DC_REASON_SHIFT, DC_CAUSE_SHIFT, DC_FIELD_MASK = 0xFF, 8, 16, 0xFF  # the state word's layout
(
    DC_REASON_NONE,
    DC_REASON_STOP_GENERATING,
    DC_REASON_KILL,
    DC_REASON_CLIENT_DISCONNECTED,
    DC_REASON_PARENT,
    DC_REASON_DEADLINE,
    DC_REASON_CONNECTION_LOST,
    DC_REASON_SHUTDOWN,
) = range(8)
ALL_REASONS = range(1, 8)
ENUM_VALUES = {name: value for name, value in globals().items() if name.startswith("DC_")}
REASON_NAMES = {
    1: "stop_generating",
    2: "kill",
    3: "client_disconnected",
    4: "parent",
    5: "deadline",
    6: "connection_lost",
    7: "shutdown",
}

ffi = cffi.FFI()

_lib = None  # the loaded library; never released, never dlclose'd
_lib_lock = threading.Lock()


# The test library's one export beyond the header's (selftest_library.py).
SELFTEST_CDEF = "int dc_selftest_panic(void);"


def load():
    """cdef the header and dlopen the library, once. RTLD_NODELETE: a Go
    runtime must never be unloaded. In a fresh interpreter started by
    selftest_library.run_in_fresh_interpreter it is the test library
    instead, with dc_selftest_panic declared too."""
    global _lib
    with _lib_lock:
        if _lib is None:
            test_library = os.environ.get(SELFTEST_ENV)
            cdef = header_cdef(header_text())
            ffi.cdef(cdef + "\n" + SELFTEST_CDEF if test_library else cdef)
            _lib = ffi.dlopen(test_library or str(LIB_PATH), ffi.RTLD_NOW | ffi.RTLD_NODELETE)
        return _lib


@pytest.fixture(scope="module", name="lib")
def lib_fixture():
    """The fixture ``lib``, the loaded library, for each test module that
    imports it."""
    if not LIB_PATH.is_file() or not HEADER_PATH.is_file():
        pytest.skip(f"{LIB_PATH} or {HEADER_PATH} is not built (run `python build.py`)")
    return load()


# ---------------------------------------------------------------------------
# Small helpers (what a C user would write once)
# ---------------------------------------------------------------------------


def last_error(lib) -> str:
    n = lib.dc_last_error(ffi.NULL, 0)
    buf = ffi.new("char[]", n + 1)
    assert lib.dc_last_error(buf, n + 1) == n
    return ffi.string(buf).decode("utf-8")


# Functions whose messages are named after another (none: every message
# names the function the caller called).
MESSAGE_NAMED_AFTER: dict = {}


def expect(lib, rc: int, code: int, function: str) -> str:
    """Assert rc == code (an error) and that the thread's message names the function."""
    assert rc == code, f"{function}: expected {code}, got {rc} ({last_error(lib)!r})"
    msg = last_error(lib)
    assert msg, f"{function} returned {code} but left no message"
    assert function in msg or MESSAGE_NAMED_AFTER.get(function, function) in msg, msg
    return msg


def ok(lib, rc: int) -> None:
    assert rc == DC_OK, f"rc={rc}: {last_error(lib)!r}"


def new_ctx(lib, id: Optional[str] = None) -> int:
    out = ffi.new("uint64_t *")
    if id is None:
        ok(lib, lib.dc_context_new_uuid(out))
    else:
        raw = id.encode("utf-8")
        ok(lib, lib.dc_context_new(raw, len(raw), out))
    assert out[0] != 0
    return out[0]


def new_child(lib, parent: int) -> int:
    out = ffi.new("uint64_t *")
    ok(lib, lib.dc_context_child(parent, out))
    return out[0]


def ctx_id(lib, h: int) -> str:
    n = ffi.new("size_t *")
    rc = lib.dc_context_id(h, ffi.NULL, 0, n)
    assert rc == DC_ERANGE
    buf = ffi.new("char[]", n[0] + 1)
    ok(lib, lib.dc_context_id(h, buf, n[0] + 1, n))
    return ffi.unpack(buf, n[0]).decode("utf-8")


def state(lib, h: int) -> Tuple[int, int]:
    word = ffi.new("uint32_t *")
    ok(lib, lib.dc_context_state(h, word))
    assert word[0] >> 24 == 0, hex(word[0])  # bits 16-23 are the cause
    return word[0] & DC_STATE_MASK, (word[0] >> DC_REASON_SHIFT) & DC_FIELD_MASK


def free_all(lib, *handles: int) -> None:
    for h in handles:
        ok(lib, lib.dc_context_free(h))


def new_queue(lib) -> Tuple[int, int]:
    q = ffi.new("uint64_t *")
    fd = ffi.new("int *")
    ok(lib, lib.dc_queue_new(q, fd))
    assert q[0] != 0 and fd[0] >= 0
    return q[0], fd[0]


def drain(lib, q: int, cap: int = 64) -> List[int]:
    buf = ffi.new("uint64_t[]", max(cap, 1))
    n = ffi.new("size_t *")
    ok(lib, lib.dc_queue_drain(q, buf, cap, n))
    assert n[0] <= cap
    return [buf[i] for i in range(n[0])]


def readable(fd: int, timeout: float = 0.0) -> bool:
    r, _, _ = select.select([fd], [], [], timeout)
    return bool(r)


def counts(lib) -> Tuple[int, int, int]:
    gc.collect()  # free handles owned by unreachable Python objects of other tests first
    c, q, other = ffi.new("uint64_t *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
    ok(lib, lib.dc_handle_counts(c, q, other))
    return c[0], q[0], other[0]
