"""The C ABI of the native library (docs/c-abi.md), driven directly with cffi.

Everything here is written the way a C user would write it from the header and
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
import importlib.util
import os
import random
import re
import select
import shutil
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

cffi = pytest.importorskip("cffi")

import dynamo_ctx  # noqa: E402 - importing the package does not load the library

PACKAGE_DIR = Path(dynamo_ctx.__file__).resolve().parent
LIB_PATH = PACKAGE_DIR / "_native.abi3.so"
HEADER_PATH = PACKAGE_DIR / "include" / "dynamo_ctx.h"  # the public header, shipped
GENERATED_HEADER_PATH = PACKAGE_DIR / "_native.abi3.h"  # cgo's, internal (source tree only)
HANG = 10.0  # seconds: a generous bound that only catches hangs, never a sleep

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


# The values a C user relies on, typed in by hand from docs/c-abi.md (the
# errno-like codes, the states, the reasons) as plain module-level names, like
# a C user's #include gives; test_enum_values_match_the_header checks them
# against the header.
DC_OK, DC_ENOENT, DC_EIO, DC_EBADF, DC_EAGAIN, DC_EEXIST, DC_EINVAL, DC_ERANGE = 0, 2, 5, 9, 11, 17, 22, 34
DC_EINTERNAL = 1000
DC_LIVE, DC_STOPPED, DC_KILLED = 0, 1, 2
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


def load():
    """cdef the header and dlopen the library, once. RTLD_NODELETE: a Go
    runtime must never be unloaded."""
    global _lib
    with _lib_lock:
        if _lib is None:
            ffi.cdef(header_cdef(HEADER_PATH.read_text("utf-8")))
            _lib = ffi.dlopen(str(LIB_PATH), ffi.RTLD_NOW | ffi.RTLD_NODELETE)
        return _lib


@pytest.fixture(scope="module")
def lib():
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
    return word[0] & 0xFF, (word[0] >> 8) & 0xFF


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


def run_in_fresh_interpreter(function: str) -> None:
    """Run this module's `function` in a new Python process that only dlopens the library.

    Used for the log queue: it is process-wide, and once the dynamo_ctx Python
    binding is loaded in this process its daemon thread drains it, so what this
    process's queue holds depends on which tests ran before.
    """
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(Path(__file__).resolve().parent)!r}, {str(PACKAGE_DIR.parent)!r}]\n"
        "import test_c_abi\n"
        f"test_c_abi.{function}()\n"
        "assert 'dynamo_ctx._native' not in sys.modules\n"
        "print('done')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", (
        f"{function} failed in a fresh interpreter (exit {proc.returncode}):\n{proc.stderr}"
    )
    # The library never writes to stdout/stderr itself.
    assert proc.stderr == "", proc.stderr


# ---------------------------------------------------------------------------
# Declarations vs. the generated header
# ---------------------------------------------------------------------------


def enum_values(text: str) -> dict:
    return {name: int(value) for name, value in re.findall(r"\b(DC_[A-Z_]+)\s*=\s*(\d+)", text)}


def test_enum_values_match_the_header(lib):
    # Every value written by hand here is the header's (the header defines
    # more: the request-plane codes, which this module does not use), as
    # cffi read it from the header and as a regex reads the text.
    assert {name: getattr(lib, name) for name in ENUM_VALUES} == ENUM_VALUES
    header = enum_values(HEADER_PATH.read_text("utf-8"))
    assert {name: header.get(name) for name in ENUM_VALUES} == ENUM_VALUES


def test_header_cdef_drops_only_the_preprocessor():
    text = "\n".join(
        ["#ifndef X", "#define X", "enum { A = 1 };", "#ifdef __cplusplus", 'extern "C" {', "#endif", "int f(void);"]
        + ["#ifdef __cplusplus", "}", "#endif", "#endif"]
    )
    assert header_cdef(text).split() == ["enum", "{", "A", "=", "1", "};", "int", "f(void);"]


def _header_is_stale() -> bool:
    go_dir = PACKAGE_DIR.parents[1] / "go"
    if not go_dir.is_dir():  # an installed wheel: the header is what was built
        return False
    built = GENERATED_HEADER_PATH.stat().st_mtime_ns
    return any(p.stat().st_mtime_ns > built for p in go_dir.rglob("*.go"))


def test_called_functions_are_declared_and_exported():
    """Every dc_* function this module calls is in the public header and
    exported (test_public_header_matches_the_exports checks the prototypes)."""
    if not GENERATED_HEADER_PATH.is_file() or not HEADER_PATH.is_file():
        pytest.skip("headers not built (run `python build.py`)")
    if _header_is_stale():
        pytest.skip("the generated header is older than the Go sources (run `python build.py`)")
    exported = set(re.findall(r"^extern [^(]*?\b(dc_\w+)\(", GENERATED_HEADER_PATH.read_text("utf-8"), re.M))
    declared = set(re.findall(r"\b(dc_\w+)\(", header_cdef(HEADER_PATH.read_text("utf-8"))))
    called = set(re.findall(r"\blib\.(dc_\w+)\(", Path(__file__).read_text("utf-8")))
    assert len(called) > 20
    assert called - declared == set()
    assert declared - exported == set()


def test_public_header_matches_the_exports():
    """The hand-written header declares every export, and only those, with
    cgo's types modulo const (build.py checks the same at every build)."""
    build = _import_build()
    if not GENERATED_HEADER_PATH.is_file() or not HEADER_PATH.is_file():
        pytest.skip("headers not built (run `python build.py`)")
    if _header_is_stale():
        pytest.skip("the generated header is older than the Go sources (run `python build.py`)")
    public = HEADER_PATH.read_text("utf-8")
    assert build.check_header(public, GENERATED_HEADER_PATH.read_text("utf-8")) == []
    assert "dc_set_error" not in public and "_GoString_" not in public, "internals stay internal"
    # The check itself sees a drift: a parameter dropped, a type changed.
    generated = GENERATED_HEADER_PATH.read_text("utf-8")
    dropped = public.replace("int dc_arm(uint64_t h, uint64_t q, uint64_t token);", "int dc_arm(uint64_t h, uint64_t q);")
    assert build.check_header(dropped, generated)
    assert build.check_header(public.replace("int dc_log_set_level(int level);", "int dc_log_set_level(long level);"), generated)


def test_public_header_compiles_as_c_and_cpp(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not HEADER_PATH.is_file():
        pytest.skip("no C compiler or header")
    src = tmp_path / "use.c"
    src.write_text('#include "dynamo_ctx.h"\nint main(void) { return dc_version() == 0 && DC_OK == 0; }\n')
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-fsyntax-only", "-I", str(HEADER_PATH.parent), str(src)], check=True)
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is not None:
        subprocess.run([cxx, "-Wall", "-Werror", "-fsyntax-only", "-x", "c++", "-I", str(HEADER_PATH.parent), str(src)], check=True)


def test_doc_examples_compile_against_the_header(tmp_path):
    """docs/c-abi.md's examples compile, warning-free, with the public header."""
    cc = shutil.which("cc") or shutil.which("gcc")
    doc = PACKAGE_DIR.parents[1] / "docs" / "c-abi.md"
    if cc is None or not HEADER_PATH.is_file() or not doc.is_file():
        pytest.skip("no C compiler, header or docs")
    blocks = re.findall(r"```c\n(.*?)```", doc.read_text("utf-8"), re.S)
    assert len(blocks) == 2
    for i, block in enumerate(blocks):
        src = tmp_path / f"example{i}.c"
        src.write_text(block)
        subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-fsyntax-only", "-I", str(HEADER_PATH.parent), str(src)], check=True)


def _import_build():
    root = PACKAGE_DIR.parents[1]
    if not (root / "build.py").is_file():
        pytest.skip("needs the source tree (build.py)")
    spec = importlib.util.spec_from_file_location("dynamo_ctx_build", root / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------
# Library
# ---------------------------------------------------------------------------


def test_version(lib):
    v = ffi.string(lib.dc_version()).decode("ascii")
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", v), v
    assert v == dynamo_ctx.__version__
    assert lib.dc_version() == lib.dc_version()  # static string, same pointer


LOADER_C = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
int main(int argc, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_NODELETE);
    if (!lib) { printf("dlopen: %s\n", dlerror()); return 1; }
    const char *(*version)(void) = (const char *(*)(void))dlsym(lib, "dc_version");
    int (*new_uuid)(uint64_t *) = (int (*)(uint64_t *))dlsym(lib, "dc_context_new_uuid");
    int (*kill)(uint64_t) = (int (*)(uint64_t))dlsym(lib, "dc_context_kill");
    int (*free_)(uint64_t) = (int (*)(uint64_t))dlsym(lib, "dc_context_free");
    uint64_t h;
    if (new_uuid(&h) || kill(h) || free_(h)) { printf("call failed\n"); return 1; }
    printf("%s\n", version());
    return 0;
}
"""


def test_loads_in_a_process_without_python(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not LIB_PATH.is_file():
        pytest.skip("needs a C compiler and the built library")
    src, exe = tmp_path / "load.c", tmp_path / "load"
    src.write_text(LOADER_C)
    subprocess.run([cc, "-o", str(exe), str(src), "-ldl"], check=True, capture_output=True, timeout=120)
    out = subprocess.run([str(exe), str(LIB_PATH)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == dynamo_ctx.__version__


def test_last_error_buffer_protocol(lib):
    out = ffi.new("uint64_t *")
    rc = lib.dc_context_new(ffi.NULL, 3, out)
    msg = expect(lib, rc, DC_EINVAL, "dc_context_new")
    n = lib.dc_last_error(ffi.NULL, 0)  # NULL asks for the length
    assert n == len(msg.encode())
    small = ffi.new("char[]", b"\xaa" * 8)
    assert lib.dc_last_error(small, 5) == n  # full length even when truncated
    assert ffi.unpack(small, 5) == msg.encode()[:4] + b"\0"
    assert small[5] == b"\xaa"  # nothing past cap
    untouched = ffi.new("char[]", b"\xaa" * 4)
    assert lib.dc_last_error(untouched, 0) == n
    assert ffi.unpack(untouched, 4) == b"\xaa" * 4
    # Successful calls leave the message alone.
    h = new_ctx(lib)
    state(lib, h)
    free_all(lib, h)
    assert last_error(lib) == msg


def test_last_error_is_per_thread(lib):
    out = ffi.new("uint64_t *")
    expect(lib, lib.dc_context_new(b"x", 0, out), DC_EINVAL, "dc_context_new")
    main_msg = last_error(lib)
    seen = {}

    def other():
        seen["before"] = lib.dc_last_error(ffi.NULL, 0)  # a fresh thread has no message
        seen["rc"] = lib.dc_context_state(0, ffi.new("uint32_t *"))
        seen["after"] = last_error(lib)

    t = threading.Thread(target=other)
    t.start()
    t.join(HANG)
    assert seen["before"] == 0
    assert seen["rc"] == DC_EBADF
    assert "dc_context_state" in seen["after"]
    assert last_error(lib) == main_msg


def test_selftest_panic_is_recovered(lib):
    before = counts(lib)
    for _ in range(50):
        rc = lib.dc_selftest_panic()
        msg = expect(lib, rc, DC_EINTERNAL, "dc_selftest_panic")
        assert DC_EINTERNAL == 1000
        assert "panic" in msg
    # The library keeps working, on this thread and on others.
    h = new_ctx(lib, "after-panic")
    ok(lib, lib.dc_context_kill(h))
    assert state(lib, h) == (DC_KILLED, DC_REASON_KILL)
    assert ctx_id(lib, h) == "after-panic"
    free_all(lib, h)
    result = {}
    t = threading.Thread(target=lambda: result.update(rc=lib.dc_selftest_panic(), msg=last_error(lib)))
    t.start()
    t.join(HANG)
    assert result["rc"] == DC_EINTERNAL and "panic" in result["msg"]
    assert counts(lib) == before


def test_reason_names(lib):
    n = ffi.new("size_t *")
    for reason, name in REASON_NAMES.items():
        buf = ffi.new("char[64]")
        ok(lib, lib.dc_reason_name(reason, buf, 64, n))
        assert ffi.string(buf).decode() == name
        assert n[0] == len(name)
        # Too small by one (no room for the NUL): DC_ERANGE with the length.
        exact = ffi.new("char[]", len(name))
        expect(lib, lib.dc_reason_name(reason, exact, len(name), n), DC_ERANGE, "dc_reason_name")
        assert n[0] == len(name)
        expect(lib, lib.dc_reason_name(reason, ffi.NULL, 0, n), DC_ERANGE, "dc_reason_name")
        assert n[0] == len(name)
    for bad in (DC_REASON_NONE, 8, 255, 256 + DC_REASON_KILL, 2**32 - 1):
        buf = ffi.new("char[64]")
        expect(lib, lib.dc_reason_name(bad, buf, 64, n), DC_EINVAL, "dc_reason_name")


def test_string_constants(lib):
    """The facts Go owns and Python reads through the module's constants."""
    from dynamo_ctx import _native

    n = ffi.new("size_t *")
    for name, attr in (("handler_error_prefix", "HANDLER_ERROR_PREFIX"), ("nats_env", "NATS_ENV"),
                       ("nats_default_url", "DEFAULT_NATS_URL"), ("kill_trace_env", "KILL_TRACE_ENV")):
        buf = ffi.new("char[256]")
        ok(lib, lib.dc_string_constant(name.encode(), buf, 256, n))
        value = ffi.string(buf).decode()
        assert value and n[0] == len(value)
        assert getattr(_native, attr) == value
        expect(lib, lib.dc_string_constant(name.encode(), ffi.NULL, 0, n), DC_ERANGE, "dc_string_constant")
    assert _native.NATS_ENV == "NATS_SERVER"
    expect(lib, lib.dc_string_constant(b"no_such_constant", ffi.new("char[64]"), 64, n), DC_ENOENT, "dc_string_constant")
    expect(lib, lib.dc_string_constant(ffi.NULL, ffi.new("char[64]"), 64, n), DC_EINVAL, "dc_string_constant")


# ---------------------------------------------------------------------------
# Contexts: creation and ids
# ---------------------------------------------------------------------------


def test_create_with_id_and_uuid(lib):
    h = new_ctx(lib, "req-42")
    assert ctx_id(lib, h) == "req-42"
    assert state(lib, h) == (DC_LIVE, DC_REASON_NONE)
    u1, u2 = new_ctx(lib), new_ctx(lib)
    s1, s2 = ctx_id(lib, u1), ctx_id(lib, u2)
    for s in (s1, s2):
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", s), s
        assert uuid.UUID(s).version == 4
    assert s1 != s2
    assert len({h, u1, u2}) == 3
    free_all(lib, h, u1, u2)


@pytest.mark.parametrize(
    "id",
    ["a", "req-42", "réq-ñ-日本語-🙂", "x" * 4096, "é" * 2048, "🙂" * 1024, "tab\tand space ", "\x01\x7f"],
    ids=["one-byte", "ascii", "non-ascii", "4096-ascii", "4096-2byte", "4096-4byte", "whitespace", "controls"],
)
def test_id_round_trip(lib, id):
    h = new_ctx(lib, id)
    assert ctx_id(lib, h) == id
    free_all(lib, h)


def test_id_is_length_delimited_not_nul_terminated(lib):
    out = ffi.new("uint64_t *")
    raw = ffi.new("char[]", b"abcdef")  # only the first 3 bytes are the id
    ok(lib, lib.dc_context_new(raw, 3, out))
    assert ctx_id(lib, out[0]) == "abc"
    free_all(lib, out[0])


def test_context_id_buffer_too_small(lib):
    id = "req-ünïcode-77"
    raw = id.encode()
    h = new_ctx(lib, id)
    n = ffi.new("size_t *")
    for cap in (0, 1, len(raw) // 2, len(raw)):  # len(raw) leaves no room for the NUL
        n[0] = 12345
        buf = ffi.new("char[]", max(cap, 1))
        expect(lib, lib.dc_context_id(h, buf if cap else ffi.NULL, cap, n), DC_ERANGE, "dc_context_id")
        assert n[0] == len(raw)
    buf = ffi.new("char[]", b"\xaa" * (len(raw) + 4))
    ok(lib, lib.dc_context_id(h, buf, n[0] + 1, n))
    assert n[0] == len(raw)
    assert ffi.unpack(buf, len(raw) + 2) == raw + b"\0\xaa"  # NUL-terminated, nothing past it
    free_all(lib, h)


def test_length_pointer_may_be_null_for_string_getters(lib):
    h = new_ctx(lib, "req-9")
    buf = ffi.new("char[16]")
    ok(lib, lib.dc_context_id(h, buf, 16, ffi.NULL))
    assert ffi.string(buf) == b"req-9"
    expect(lib, lib.dc_context_id(h, buf, 3, ffi.NULL), DC_ERANGE, "dc_context_id")
    ok(lib, lib.dc_reason_name(DC_REASON_KILL, buf, 16, ffi.NULL))
    assert ffi.string(buf) == b"kill"
    free_all(lib, h)


@pytest.mark.parametrize(
    "raw,length",
    [
        (None, 3),
        (b"", 0),
        (b"abc", 0),
        (b"x" * 4097, 4097),
        (b"\xff\xfe", 2),
        (b"\xed\xa0\x80", 3),  # a UTF-16 surrogate, not valid UTF-8
        (b"\xc0\xaf", 2),  # overlong encoding
        ("日".encode()[:2], 2),  # truncated sequence
        (b"ab\0cd", 5),
        (b"\0", 1),
    ],
    ids=["null", "empty", "zero-len", "4097", "ff-fe", "surrogate", "overlong", "truncated", "nul", "only-nul"],
)
def test_bad_ids(lib, raw, length):
    before = counts(lib)
    out = ffi.new("uint64_t *", 0)
    arg = ffi.NULL if raw is None else ffi.new("char[]", raw)
    expect(lib, lib.dc_context_new(arg, length, out), DC_EINVAL, "dc_context_new")
    assert out[0] == 0  # nothing stored on failure
    assert counts(lib) == before


def test_null_out_pointers(lib):
    h = new_ctx(lib)
    q, _ = new_queue(lib)
    cases = [
        ("dc_context_new", lambda: lib.dc_context_new(b"abc", 3, ffi.NULL)),
        ("dc_context_new_uuid", lambda: lib.dc_context_new_uuid(ffi.NULL)),
        ("dc_context_state", lambda: lib.dc_context_state(h, ffi.NULL)),
        ("dc_context_state_word", lambda: lib.dc_context_state_word(h, ffi.NULL)),
        ("dc_context_child", lambda: lib.dc_context_child(h, ffi.NULL)),
        ("dc_queue_new", lambda: lib.dc_queue_new(ffi.NULL, ffi.new("int *"))),
        ("dc_queue_new", lambda: lib.dc_queue_new(ffi.new("uint64_t *"), ffi.NULL)),
        ("dc_queue_drain", lambda: lib.dc_queue_drain(q, ffi.new("uint64_t[4]"), 4, ffi.NULL)),
        ("dc_queue_drain", lambda: lib.dc_queue_drain(q, ffi.NULL, 4, ffi.new("size_t *"))),
        ("dc_queue_drain_after", lambda: lib.dc_queue_drain_after(q, ffi.NULL)),
        ("dc_log_fd", lambda: lib.dc_log_fd(ffi.NULL)),
        ("dc_log_next", lambda: lib.dc_log_next(ffi.NULL, ffi.new("char[64]"), 64, ffi.new("size_t *"))),
        ("dc_log_next", lambda: lib.dc_log_next(ffi.new("int *"), ffi.new("char[64]"), 64, ffi.NULL)),
    ]
    before = counts(lib)
    for name, call in cases:
        expect(lib, call(), DC_EINVAL, name)
    assert counts(lib) == before  # nothing was created by the failing calls
    # dc_handle_counts accepts NULL for either pointer.
    ok(lib, lib.dc_handle_counts(ffi.NULL, ffi.NULL, ffi.NULL))
    # A drain with no buffer and cap 0 is valid and takes nothing.
    n = ffi.new("size_t *", 99)
    ok(lib, lib.dc_queue_drain(q, ffi.NULL, 0, n))
    assert n[0] == 0
    free_all(lib, h)
    ok(lib, lib.dc_queue_free(q))


# ---------------------------------------------------------------------------
# Contexts: state word, cancellation, children
# ---------------------------------------------------------------------------


def test_state_word_pointer(lib):
    h = new_ctx(lib)
    p = ffi.new("uint32_t **")
    ok(lib, lib.dc_context_state_word(h, p))
    word = p[0]
    assert word != ffi.NULL
    p2 = ffi.new("uint32_t **")
    ok(lib, lib.dc_context_state_word(h, p2))
    assert p2[0] == word  # one word per context, stable
    assert word[0] == DC_LIVE | DC_REASON_NONE << 8
    ok(lib, lib.dc_context_stop_generating(h))
    # Read without calling into the library: the store happened before the call returned.
    # state | reason << 8 | cause << 16: a direct stop is its own cause.
    assert word[0] == DC_STOPPED | DC_REASON_STOP_GENERATING << 8 | DC_REASON_STOP_GENERATING << 16
    ok(lib, lib.dc_context_kill(h))
    assert word[0] & 0xFF == DC_KILLED
    assert (word[0] >> 8) & 0xFF == DC_REASON_KILL
    assert word[0] >> 16 == DC_REASON_KILL  # the cause: a direct kill is its own
    other = new_ctx(lib)
    ok(lib, lib.dc_context_state_word(other, p2))
    assert p2[0] != word and p2[0][0] == 0
    free_all(lib, h, other)


def test_stop_then_kill_then_stop_is_monotonic(lib):
    h = new_ctx(lib)
    assert state(lib, h) == (DC_LIVE, DC_REASON_NONE)
    ok(lib, lib.dc_context_stop_generating(h))
    assert state(lib, h) == (DC_STOPPED, DC_REASON_STOP_GENERATING)
    ok(lib, lib.dc_context_stop_generating(h))  # idempotent
    ok(lib, lib.dc_context_cancel(h, DC_STOPPED, DC_REASON_DEADLINE))  # already there: unchanged
    assert state(lib, h) == (DC_STOPPED, DC_REASON_STOP_GENERATING)
    ok(lib, lib.dc_context_kill(h))
    assert state(lib, h) == (DC_KILLED, DC_REASON_KILL)
    ok(lib, lib.dc_context_stop_generating(h))  # never backwards
    ok(lib, lib.dc_context_kill(h))
    ok(lib, lib.dc_context_cancel(h, DC_KILLED, DC_REASON_SHUTDOWN))
    ok(lib, lib.dc_context_cancel(h, DC_STOPPED, DC_REASON_DEADLINE))
    assert state(lib, h) == (DC_KILLED, DC_REASON_KILL)
    # kill on a live context goes straight to KILLED.
    k = new_ctx(lib)
    ok(lib, lib.dc_context_kill(k))
    assert state(lib, k) == (DC_KILLED, DC_REASON_KILL)
    free_all(lib, h, k)


@pytest.mark.parametrize("target", [DC_STOPPED, DC_KILLED], ids=["stopped", "killed"])
@pytest.mark.parametrize("reason", list(ALL_REASONS), ids=[REASON_NAMES[r] for r in ALL_REASONS])
def test_cancel_with_each_reason(lib, target, reason):
    h = new_ctx(lib)
    ok(lib, lib.dc_context_cancel(h, target, reason))
    assert state(lib, h) == (target, reason)
    free_all(lib, h)


def test_cancel_rejects_bad_state_and_reason(lib):
    h = new_ctx(lib)
    for bad_state in (DC_LIVE, 3, 0x101, 2**32 - 1):
        expect(lib, lib.dc_context_cancel(h, bad_state, DC_REASON_KILL), DC_EINVAL, "dc_context_cancel")
    for bad_reason in (DC_REASON_NONE, 8, 255, 256 + DC_REASON_KILL, 2**32 - 1):
        for target in (DC_STOPPED, DC_KILLED):
            expect(lib, lib.dc_context_cancel(h, target, bad_reason), DC_EINVAL, "dc_context_cancel")
    assert state(lib, h) == (DC_LIVE, DC_REASON_NONE)  # the rejected calls changed nothing
    free_all(lib, h)


def test_children_follow_parent(lib):
    parent = new_ctx(lib, "req-7")
    linked = new_ctx(lib, "other-id")
    ok(lib, lib.dc_context_link_child(parent, linked))
    child = new_child(lib, parent)
    assert ctx_id(lib, child) == "req-7"
    grandchild = new_child(lib, child)
    ok(lib, lib.dc_context_stop_generating(parent))
    for h in (linked, child, grandchild):
        assert state(lib, h) == (DC_STOPPED, DC_REASON_PARENT)
    ok(lib, lib.dc_context_kill(parent))
    assert state(lib, parent) == (DC_KILLED, DC_REASON_KILL)
    for h in (linked, child, grandchild):
        assert state(lib, h) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, parent, linked, child, grandchild)


def test_child_does_not_cancel_parent(lib):
    parent = new_ctx(lib)
    child = new_child(lib, parent)
    ok(lib, lib.dc_context_kill(child))
    assert state(lib, parent) == (DC_LIVE, DC_REASON_NONE)
    free_all(lib, parent, child)


def test_stopped_child_is_killed_by_parent(lib):
    parent = new_ctx(lib)
    child = new_child(lib, parent)
    ok(lib, lib.dc_context_cancel(child, DC_STOPPED, DC_REASON_CLIENT_DISCONNECTED))
    ok(lib, lib.dc_context_kill(parent))
    assert state(lib, child) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, parent, child)


@pytest.mark.parametrize("target", [DC_STOPPED, DC_KILLED], ids=["stopped", "killed"])
def test_link_to_cancelled_parent_applies_at_once(lib, target):
    parent = new_ctx(lib)
    ok(lib, lib.dc_context_cancel(parent, target, DC_REASON_SHUTDOWN))
    child = new_ctx(lib)
    ok(lib, lib.dc_context_link_child(parent, child))
    assert state(lib, child) == (target, DC_REASON_PARENT)
    made = new_child(lib, parent)
    assert state(lib, made) == (target, DC_REASON_PARENT)
    free_all(lib, parent, child, made)


def test_cycles_and_self_links_terminate(lib):
    a, b, c = new_ctx(lib), new_ctx(lib), new_ctx(lib)
    ok(lib, lib.dc_context_link_child(a, a))
    ok(lib, lib.dc_context_link_child(a, b))
    ok(lib, lib.dc_context_link_child(b, c))
    ok(lib, lib.dc_context_link_child(c, a))
    ok(lib, lib.dc_context_link_child(a, b))  # twice is the same as once
    ok(lib, lib.dc_context_stop_generating(b))
    assert state(lib, b) == (DC_STOPPED, DC_REASON_STOP_GENERATING)
    assert state(lib, c) == (DC_STOPPED, DC_REASON_PARENT)
    assert state(lib, a) == (DC_STOPPED, DC_REASON_PARENT)
    ok(lib, lib.dc_context_kill(a))
    assert state(lib, a) == (DC_KILLED, DC_REASON_KILL)
    assert state(lib, b) == (DC_KILLED, DC_REASON_PARENT)
    assert state(lib, c) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, a, b, c)


def test_deep_chain(lib):
    root = new_ctx(lib)
    chain = [root]
    for _ in range(5000):
        chain.append(new_child(lib, chain[-1]))
    ok(lib, lib.dc_context_kill(root))
    assert state(lib, chain[-1]) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, *chain)


def test_finish_unlinks_from_parents(lib):
    parent = new_ctx(lib)
    done = new_child(lib, parent)
    running = new_child(lib, parent)
    below_done = new_child(lib, done)
    ok(lib, lib.dc_context_finish(done))
    ok(lib, lib.dc_context_finish(done))  # idempotent
    ok(lib, lib.dc_context_kill(parent))
    assert state(lib, running) == (DC_KILLED, DC_REASON_PARENT)
    assert state(lib, done) == (DC_LIVE, DC_REASON_NONE)  # no longer follows the parent
    assert state(lib, below_done) == (DC_LIVE, DC_REASON_NONE)
    ok(lib, lib.dc_context_stop_generating(done))  # its own children still follow it
    assert state(lib, below_done) == (DC_STOPPED, DC_REASON_PARENT)
    free_all(lib, parent, done, running, below_done)


def test_freed_handle_context_keeps_propagating(lib):
    parent = new_ctx(lib)
    middle = new_child(lib, parent)
    leaf = new_child(lib, middle)
    free_all(lib, middle)  # the handle goes; the context stays in the tree
    ok(lib, lib.dc_context_kill(parent))
    assert state(lib, leaf) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, parent, leaf)


# ---------------------------------------------------------------------------
# Event queues
# ---------------------------------------------------------------------------


def test_the_fd_carries_the_tokens(lib):
    """A reader may take the tokens from the fd itself (8 bytes each, native
    byte order) without calling the library, and must call dc_queue_drain
    after reading more than dc_queue_drain_after's bytes: a token that found
    the pipe full waits in the library, oldest after the pipe's."""
    import struct

    q, fd = new_queue(lib)
    after = ffi.new("size_t *")
    ok(lib, lib.dc_queue_drain_after(q, after))
    assert after[0] == 64 * 1024 - os.sysconf("SC_PAGE_SIZE")
    expect(lib, lib.dc_queue_drain_after(0, after), DC_EBADF, "dc_queue_drain_after")
    hs = [new_ctx(lib) for _ in range(8192 + 3)]  # a 64 KiB pipe's worth, and 3 more
    for i, h in enumerate(hs):
        ok(lib, lib.dc_context_watch(h, q, DC_KILLED, 1000 + i))
    for h in hs:
        ok(lib, lib.dc_context_kill(h))
    data = b""
    while readable(fd):
        data += os.read(fd, 4096)
    assert len(data) == 8192 * 8 > after[0]
    assert list(struct.unpack(f"={8192}Q", data)) == list(range(1000, 1000 + 8192))
    assert drain(lib, q) == [1000 + 8192, 1000 + 8193, 1000 + 8194]
    h = new_ctx(lib)
    ok(lib, lib.dc_context_watch(h, q, DC_KILLED, 7))
    ok(lib, lib.dc_context_kill(h))
    assert os.read(fd, 4096) == struct.pack("=Q", 7)  # the pipe carries the next ones again
    free_all(lib, h, *hs)
    ok(lib, lib.dc_queue_free(q))


def test_watch_fires_once_and_fd_follows_the_queue(lib):
    q, fd = new_queue(lib)
    h = new_ctx(lib)
    assert not readable(fd)
    ok(lib, lib.dc_context_watch(h, q, DC_STOPPED, 42))
    assert not readable(fd)
    assert drain(lib, q) == []
    ok(lib, lib.dc_context_stop_generating(h))
    # The token is queued before stop_generating returns.
    assert readable(fd)
    assert readable(fd, HANG)
    assert readable(fd)  # level-triggered: stays readable until drained
    assert drain(lib, q) == [42]
    assert not readable(fd)
    ok(lib, lib.dc_context_kill(h))  # fired already: nothing more
    assert not readable(fd)
    assert drain(lib, q) == []
    expect(lib, lib.dc_queue_unwatch(q, 42), DC_ENOENT, "dc_queue_unwatch")
    free_all(lib, h)
    ok(lib, lib.dc_queue_free(q))


@pytest.mark.parametrize(
    "watched, stop_first", [(DC_KILLED, True), (DC_STOPPED, False)], ids=["killed-ignores-stop", "stopped-fires-on-kill"]
)
def test_watch_fires_on_kill(lib, watched, stop_first):
    q, fd = new_queue(lib)
    h = new_ctx(lib)
    ok(lib, lib.dc_context_watch(h, q, watched, 7))
    if stop_first:  # a watch on DC_KILLED ignores a stop
        ok(lib, lib.dc_context_stop_generating(h))
        assert not readable(fd)
        assert drain(lib, q) == []
    ok(lib, lib.dc_context_kill(h))
    assert readable(fd, HANG)
    assert drain(lib, q) == [7]
    free_all(lib, h)
    ok(lib, lib.dc_queue_free(q))


def test_watch_fires_immediately_when_already_in_state(lib):
    q, fd = new_queue(lib)
    stopped, killed = new_ctx(lib), new_ctx(lib)
    ok(lib, lib.dc_context_stop_generating(stopped))
    ok(lib, lib.dc_context_kill(killed))
    ok(lib, lib.dc_context_watch(stopped, q, DC_STOPPED, 10))
    assert readable(fd)
    assert drain(lib, q) == [10]
    ok(lib, lib.dc_context_watch(killed, q, DC_STOPPED, 11))
    ok(lib, lib.dc_context_watch(killed, q, DC_KILLED, 12))
    assert drain(lib, q) == [11, 12]
    ok(lib, lib.dc_context_watch(stopped, q, DC_KILLED, 13))  # stopped is not killed
    assert not readable(fd)
    assert drain(lib, q) == []
    ok(lib, lib.dc_context_kill(stopped))
    assert drain(lib, q) == [13]
    assert not readable(fd)
    free_all(lib, stopped, killed)
    ok(lib, lib.dc_queue_free(q))


def test_watch_sees_propagation_from_parent(lib):
    q, fd = new_queue(lib)
    parent = new_ctx(lib)
    child = new_child(lib, parent)
    ok(lib, lib.dc_context_watch(child, q, DC_KILLED, 99))
    ok(lib, lib.dc_context_kill(parent))
    assert readable(fd, HANG)
    assert drain(lib, q) == [99]
    assert state(lib, child) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, parent, child)
    ok(lib, lib.dc_queue_free(q))


def test_watch_bad_state_and_duplicate_token(lib):
    q, _ = new_queue(lib)
    q2, fd2 = new_queue(lib)
    a, b = new_ctx(lib), new_ctx(lib)
    for bad in (DC_LIVE, 3, 2**32 - 1):
        expect(lib, lib.dc_context_watch(a, q, bad, 1), DC_EINVAL, "dc_context_watch")
    ok(lib, lib.dc_context_watch(a, q, DC_STOPPED, 5))
    expect(lib, lib.dc_context_watch(a, q, DC_STOPPED, 5), DC_EEXIST, "dc_context_watch")
    expect(lib, lib.dc_context_watch(b, q, DC_KILLED, 5), DC_EEXIST, "dc_context_watch")
    ok(lib, lib.dc_context_watch(b, q2, DC_KILLED, 5))  # tokens are per queue
    ok(lib, lib.dc_context_kill(a))
    assert drain(lib, q) == [5]
    ok(lib, lib.dc_context_watch(b, q, DC_KILLED, 5))  # fired, so free again
    ok(lib, lib.dc_context_kill(b))
    assert drain(lib, q) == [5]
    assert readable(fd2) and drain(lib, q2) == [5]
    free_all(lib, a, b)
    ok(lib, lib.dc_queue_free(q))
    ok(lib, lib.dc_queue_free(q2))


def test_unwatch(lib):
    q, fd = new_queue(lib)
    h = new_ctx(lib)
    expect(lib, lib.dc_queue_unwatch(q, 1), DC_ENOENT, "dc_queue_unwatch")  # never registered
    ok(lib, lib.dc_context_watch(h, q, DC_STOPPED, 1))
    ok(lib, lib.dc_context_watch(h, q, DC_STOPPED, 2))
    ok(lib, lib.dc_queue_unwatch(q, 1))
    expect(lib, lib.dc_queue_unwatch(q, 1), DC_ENOENT, "dc_queue_unwatch")
    ok(lib, lib.dc_context_kill(h))
    assert drain(lib, q) == [2]  # the unwatched token never arrives
    expect(lib, lib.dc_queue_unwatch(q, 2), DC_ENOENT, "dc_queue_unwatch")  # already fired
    # Fired but not yet drained: also DC_ENOENT, and the token stays queued.
    k = new_ctx(lib)
    ok(lib, lib.dc_context_watch(k, q, DC_KILLED, 3))
    ok(lib, lib.dc_context_kill(k))
    expect(lib, lib.dc_queue_unwatch(q, 3), DC_ENOENT, "dc_queue_unwatch")
    assert readable(fd) and drain(lib, q) == [3]
    # An unwatched token can be watched again, and then arrives exactly once.
    w = new_ctx(lib)
    ok(lib, lib.dc_context_watch(w, q, DC_STOPPED, 4))
    ok(lib, lib.dc_queue_unwatch(q, 4))
    ok(lib, lib.dc_context_watch(w, q, DC_STOPPED, 4))
    ok(lib, lib.dc_context_kill(w))
    assert drain(lib, q) == [4]
    free_all(lib, h, k, w)
    ok(lib, lib.dc_queue_free(q))


def test_tokens_are_fifo_and_any_64_bit_value(lib):
    q, fd = new_queue(lib)
    tokens = [2**64 - 1, 0, 1, 2**63, 0xDEADBEEFCAFEF00D]
    handles = [new_ctx(lib) for _ in tokens]
    for h, t in zip(handles, tokens):
        ok(lib, lib.dc_context_watch(h, q, DC_KILLED, t))
    for h in reversed(handles):
        ok(lib, lib.dc_context_kill(h))
    assert drain(lib, q) == list(reversed(tokens))
    free_all(lib, *handles)
    ok(lib, lib.dc_queue_free(q))


def test_drain_with_small_buffers(lib):
    q, fd = new_queue(lib)
    handles = [new_ctx(lib) for _ in range(5)]
    for i, h in enumerate(handles):
        ok(lib, lib.dc_context_watch(h, q, DC_STOPPED, 100 + i))
        ok(lib, lib.dc_context_kill(h))
    n = ffi.new("size_t *")
    ok(lib, lib.dc_queue_drain(q, ffi.NULL, 0, n))  # cap 0 takes nothing
    assert n[0] == 0 and readable(fd)
    assert drain(lib, q, 2) == [100, 101]
    assert readable(fd)
    assert drain(lib, q, 1) == [102]
    assert readable(fd)
    assert drain(lib, q, 2) == [103, 104]  # exactly cap and now empty
    assert not readable(fd)
    assert drain(lib, q, 2) == []
    # Many watches on one context fire in one cancel, in no particular order.
    one = new_ctx(lib)
    for t in range(20):
        ok(lib, lib.dc_context_watch(one, q, DC_KILLED, t))
    ok(lib, lib.dc_context_kill(one))
    got: List[int] = []
    while readable(fd):
        got += drain(lib, q, 3)
    assert sorted(got) == list(range(20))
    free_all(lib, one, *handles)
    ok(lib, lib.dc_queue_free(q))


def test_queue_free_with_pending_watches(lib):
    before = counts(lib)
    q, fd = new_queue(lib)
    a, b = new_ctx(lib), new_ctx(lib)
    child = new_child(lib, a)
    ok(lib, lib.dc_context_watch(a, q, DC_STOPPED, 1))
    ok(lib, lib.dc_context_watch(child, q, DC_KILLED, 2))
    ok(lib, lib.dc_context_watch(b, q, DC_KILLED, 3))
    ok(lib, lib.dc_context_kill(b))  # one token queued and never drained
    ok(lib, lib.dc_queue_free(q))
    # Cancelling the watched contexts afterwards is harmless.
    ok(lib, lib.dc_context_kill(a))
    assert state(lib, child) == (DC_KILLED, DC_REASON_PARENT)
    expect(lib, lib.dc_queue_free(q), DC_EBADF, "dc_queue_free")
    expect(lib, lib.dc_context_watch(a, q, DC_KILLED, 4), DC_EBADF, "dc_context_watch")
    expect(lib, lib.dc_queue_unwatch(q, 1), DC_EBADF, "dc_queue_unwatch")
    expect(lib, lib.dc_queue_drain(q, ffi.new("uint64_t[1]"), 1, ffi.new("size_t *")), DC_EBADF, "dc_queue_drain")
    free_all(lib, a, b, child)
    assert counts(lib) == before


def test_context_free_with_pending_watch(lib):
    q, fd = new_queue(lib)
    parent = new_ctx(lib)
    child = new_child(lib, parent)
    ok(lib, lib.dc_context_watch(child, q, DC_KILLED, 8))
    free_all(lib, child)  # the watch outlives the handle
    ok(lib, lib.dc_context_kill(parent))
    assert readable(fd) and drain(lib, q) == [8]
    free_all(lib, parent)
    ok(lib, lib.dc_queue_free(q))


def test_queue_fds_are_pipes_closed_by_free(lib):
    queues = [new_queue(lib) for _ in range(20)]
    pipes = {}
    for _, fd in queues:
        st = os.fstat(fd)
        assert stat.S_ISFIFO(st.st_mode)
        pipes[fd] = (st.st_dev, st.st_ino)
    assert len(pipes) == 20
    for q, _ in queues:
        ok(lib, lib.dc_queue_free(q))
    # Each fd is closed: the number is either unused or reused for something
    # else (the process may open files meanwhile), never still our pipe.
    for fd, ident in pipes.items():
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        assert (st.st_dev, st.st_ino) != ident, f"fd {fd} still open after dc_queue_free"


# ---------------------------------------------------------------------------
# Bad handles
# ---------------------------------------------------------------------------


def context_calls(lib, h: int):
    """Every function taking a context handle, called with h."""
    n = ffi.new("size_t *")
    return [
        ("dc_context_id", lambda: lib.dc_context_id(h, ffi.new("char[64]"), 64, n)),
        ("dc_context_state", lambda: lib.dc_context_state(h, ffi.new("uint32_t *"))),
        ("dc_context_state_word", lambda: lib.dc_context_state_word(h, ffi.new("uint32_t **"))),
        ("dc_context_cancel", lambda: lib.dc_context_cancel(h, DC_KILLED, DC_REASON_SHUTDOWN)),
        ("dc_context_stop_generating", lambda: lib.dc_context_stop_generating(h)),
        ("dc_context_kill", lambda: lib.dc_context_kill(h)),
        ("dc_context_child", lambda: lib.dc_context_child(h, ffi.new("uint64_t *"))),
        ("dc_context_finish", lambda: lib.dc_context_finish(h)),
        ("dc_context_free", lambda: lib.dc_context_free(h)),
    ]


def queue_calls(lib, q: int):
    """Every function taking a queue handle, called with q."""
    return [
        ("dc_queue_drain", lambda: lib.dc_queue_drain(q, ffi.new("uint64_t[4]"), 4, ffi.new("size_t *"))),
        ("dc_queue_unwatch", lambda: lib.dc_queue_unwatch(q, 1)),
        ("dc_queue_free", lambda: lib.dc_queue_free(q)),
    ]


def test_zero_freed_and_double_freed_handles(lib):
    live = new_ctx(lib)
    live_q, _ = new_queue(lib)
    freed = new_ctx(lib)
    free_all(lib, freed)
    freed_q, _ = new_queue(lib)
    ok(lib, lib.dc_queue_free(freed_q))
    for bad in (0, freed):
        for name, call in context_calls(lib, bad):
            expect(lib, call(), DC_EBADF, name)
        expect(lib, lib.dc_context_link_child(bad, live), DC_EBADF, "dc_context_link_child (parent)")
        expect(lib, lib.dc_context_link_child(live, bad), DC_EBADF, "dc_context_link_child (child)")
        expect(lib, lib.dc_context_watch(bad, live_q, DC_KILLED, 1), DC_EBADF, "dc_context_watch")
    for bad in (0, freed_q):
        for name, call in queue_calls(lib, bad):
            expect(lib, call(), DC_EBADF, name)
        expect(lib, lib.dc_context_watch(live, bad, DC_KILLED, 1), DC_EBADF, "dc_context_watch")
    assert state(lib, live) == (DC_LIVE, DC_REASON_NONE)  # none of that touched the live one
    free_all(lib, live)
    expect(lib, lib.dc_context_free(live), DC_EBADF, "dc_context_free")  # double free
    ok(lib, lib.dc_queue_free(live_q))
    expect(lib, lib.dc_queue_free(live_q), DC_EBADF, "dc_queue_free")


def test_wrong_kind_handles(lib):
    h = new_ctx(lib)
    q, _ = new_queue(lib)
    for name, call in context_calls(lib, q):  # a queue handle where a context is expected
        expect(lib, call(), DC_EBADF, name)
    for name, call in queue_calls(lib, h):  # and the other way round
        expect(lib, call(), DC_EBADF, name)
    expect(lib, lib.dc_context_link_child(q, h), DC_EBADF, "dc_context_link_child")
    expect(lib, lib.dc_context_watch(q, h, DC_KILLED, 1), DC_EBADF, "dc_context_watch")
    # Both still work.
    assert state(lib, h) == (DC_LIVE, DC_REASON_NONE)
    assert drain(lib, q) == []
    free_all(lib, h)
    ok(lib, lib.dc_queue_free(q))


def test_forged_generations_are_rejected(lib):
    h = new_ctx(lib)
    q, _ = new_queue(lib)
    # Any other value in the bits above the slot index of a live handle names
    # no live handle of the same slot.
    for bit in range(32, 56):
        for name, call in context_calls(lib, h ^ (1 << bit)):
            expect(lib, call(), DC_EBADF, name)
        for name, call in queue_calls(lib, q ^ (1 << bit)):
            expect(lib, call(), DC_EBADF, name)
    assert state(lib, h) == (DC_LIVE, DC_REASON_NONE)
    free_all(lib, h)
    ok(lib, lib.dc_queue_free(q))


@pytest.mark.parametrize("function", ["dc_context_kill", "dc_context_stop_generating"])
def test_shorthand_errors_name_the_function(lib, function):
    assert getattr(lib, function)(0) == DC_EBADF
    assert function in last_error(lib), last_error(lib)


def test_random_handles(lib):
    rng = random.Random(20240607)
    before = counts(lib)
    word = ffi.new("uint32_t *")
    n = ffi.new("size_t *")
    hits = 0
    for _ in range(3000):
        h = rng.getrandbits(64)
        if lib.dc_context_state(h, word) == DC_OK:
            hits += 1  # a live handle of someone else's: astronomically unlikely; leave it be
        else:
            assert lib.dc_context_state(h, word) == DC_EBADF
            assert lib.dc_context_kill(h) == DC_EBADF
            assert lib.dc_context_free(h) == DC_EBADF
        if lib.dc_queue_drain(h, ffi.NULL, 0, n) == DC_OK:
            hits += 1
        else:
            assert lib.dc_queue_drain(h, ffi.NULL, 0, n) == DC_EBADF
            assert lib.dc_queue_unwatch(h, 1) == DC_EBADF
            assert lib.dc_queue_free(h) == DC_EBADF
    assert hits == 0
    assert "bad handle" in last_error(lib)
    assert counts(lib) == before


# ---------------------------------------------------------------------------
# Handle accounting and threads
# ---------------------------------------------------------------------------


def test_handle_counts_track_creates_and_frees(lib):
    c0, q0, o0 = counts(lib)
    hs = [new_ctx(lib) for _ in range(10)]
    qs = [new_queue(lib)[0] for _ in range(3)]
    assert counts(lib) == (c0 + 10, q0 + 3, o0)
    free_all(lib, *hs)
    for q in qs:
        ok(lib, lib.dc_queue_free(q))
    assert counts(lib) == (c0, q0, o0)
    only = ffi.new("uint64_t *")
    ok(lib, lib.dc_handle_counts(only, ffi.NULL, ffi.NULL))
    assert only[0] == c0


def test_many_create_free_cycles_leave_counts_unchanged(lib):
    before = counts(lib)
    out = ffi.new("uint64_t *")
    new_uuid, new_named, free = lib.dc_context_new_uuid, lib.dc_context_new, lib.dc_context_free
    for i in range(100_000):
        rc = new_uuid(out) if i & 1 else new_named(b"req", 3, out)
        assert rc == DC_OK
        assert free(out[0]) == DC_OK
    assert counts(lib) == before
    q = ffi.new("uint64_t *")
    fd = ffi.new("int *")
    h = new_ctx(lib)
    for i in range(2000):
        assert lib.dc_queue_new(q, fd) == DC_OK
        assert lib.dc_context_watch(h, q[0], DC_KILLED, i) == DC_OK
        assert lib.dc_queue_free(q[0]) == DC_OK
    free_all(lib, h)
    assert counts(lib) == before


def test_threads_create_link_kill_free(lib):
    before = counts(lib)
    errors: List[str] = []

    def worker(k: int) -> None:
        try:
            out = ffi.new("uint64_t *")
            word = ffi.new("uint32_t *")
            bad_len = 5000 + k  # a thread-specific failure, to check messages stay per thread
            for i in range(5000):
                assert lib.dc_context_new_uuid(out) == DC_OK
                parent = out[0]
                assert lib.dc_context_new(b"linked", 6, out) == DC_OK
                linked = out[0]
                assert lib.dc_context_link_child(parent, linked) == DC_OK
                assert lib.dc_context_child(parent, out) == DC_OK
                child = out[0]
                if i % 2:
                    assert lib.dc_context_kill(parent) == DC_OK
                else:
                    assert lib.dc_context_kill(linked) == DC_OK
                    assert lib.dc_context_kill(parent) == DC_OK
                assert lib.dc_context_state(child, word) == DC_OK
                # Propagated: reason parent, cause the kill at the origin.
                assert word[0] == DC_KILLED | DC_REASON_PARENT << 8 | DC_REASON_KILL << 16
                assert lib.dc_context_state(linked, word) == DC_OK
                assert word[0] & 0xFF == DC_KILLED
                for h in (parent, linked, child):
                    assert lib.dc_context_free(h) == DC_OK
                if i % 500 == 0:
                    assert lib.dc_context_new(b"x" * bad_len, bad_len, out) == DC_EINVAL
                    assert f"got {bad_len}" in last_error(lib), last_error(lib)
        except BaseException as exc:  # report, do not hang the join
            errors.append(f"thread {k}: {exc!r}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert errors == []
    assert counts(lib) == before


def test_kill_races_with_linking(lib):
    parent = new_ctx(lib)
    linked_some = threading.Event()
    children: List[int] = []

    def linker() -> None:
        out = ffi.new("uint64_t *")
        for i in range(3000):
            assert lib.dc_context_new_uuid(out) == DC_OK
            assert lib.dc_context_link_child(parent, out[0]) == DC_OK
            children.append(out[0])
            if i == 100:
                linked_some.set()

    t = threading.Thread(target=linker)
    t.start()
    assert linked_some.wait(HANG)
    ok(lib, lib.dc_context_kill(parent))
    t.join(HANG)
    assert not t.is_alive() and len(children) == 3000
    # Each child was linked either before the kill (and propagated to) or after (and killed at once).
    assert all(state(lib, c) == (DC_KILLED, DC_REASON_PARENT) for c in children)
    free_all(lib, parent, *children)


# ---------------------------------------------------------------------------
# Logging (in a fresh interpreter: the log queue is per process)
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


def test_log_records():
    run_in_fresh_interpreter("_scenario_log_records")


def test_log_fd_stays_readable_after_erange():
    run_in_fresh_interpreter("_scenario_log_fd_readable_after_erange")


def test_log_calls_in_process(lib):
    fd = ffi.new("int *", -1)
    ok(lib, lib.dc_log_fd(fd))
    assert fd[0] >= 0
    again = ffi.new("int *")
    ok(lib, lib.dc_log_fd(again))
    assert again[0] == fd[0]  # one fd for the life of the library
    expect(lib, lib.dc_log_fd(ffi.NULL), DC_EINVAL, "dc_log_fd")


def test_timeout_and_remaining(lib):
    """dc_context_set_timeout kills with DC_REASON_DEADLINE at the deadline; dc_context_remaining
    says how long is left (-1 without a deadline); bad seconds are DC_EINVAL; children keep the
    earlier deadline."""
    import math
    import time

    h = new_ctx(lib, "timeout")
    child = new_child(lib, h)
    out = ffi.new("double *")
    ok(lib, lib.dc_context_remaining(h, out))
    assert out[0] == -1
    for bad in (-1.0, math.nan, math.inf, float(lib.DC_MAX_TIMEOUT_SECONDS)):
        assert "timeout" in expect(lib, lib.dc_context_set_timeout(h, bad), lib.DC_EINVAL, "dc_context_set_timeout")
    ok(lib, lib.dc_context_set_timeout(h, 0.05))
    ok(lib, lib.dc_context_remaining(child, out))
    assert 0 < out[0] <= 0.05
    deadline = time.monotonic() + HANG
    while state(lib, h)[0] != lib.DC_KILLED:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert state(lib, h) == (lib.DC_KILLED, lib.DC_REASON_DEADLINE)
    ok(lib, lib.dc_context_remaining(h, out))
    assert out[0] == 0
    assert state(lib, child)[0] == lib.DC_KILLED
    expect(lib, lib.dc_context_remaining(h, ffi.NULL), lib.DC_EINVAL, "dc_context_remaining")
    free_all(lib, h, child)
    expect(lib, lib.dc_context_set_timeout(h, 1.0), lib.DC_EBADF, "dc_context_set_timeout")
