"""The C ABI (docs/c-abi.md): the shipped header against the exports, and the
library as a whole (version, errors, panics, names and constants). The other
test_c_abi_*.py files cover contexts, event queues, handles and threads, and
logging; c_abi.py has what they share."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

import dynamo_ctx

from c_abi import (
    DC_EBADF,
    DC_EINTERNAL,
    DC_EINVAL,
    DC_ENOENT,
    DC_ERANGE,
    DC_KILLED,
    DC_REASON_KILL,
    DC_REASON_NONE,
    ENUM_VALUES,
    GENERATED_HEADER_PATH,
    HEADER_PATH,
    LIB_PATH,
    PACKAGE_DIR,
    REASON_NAMES,
    SELFTEST_CDEF,
    counts,
    ctx_id,
    expect,
    ffi,
    free_all,
    header_cdef,
    header_text,
    last_error,
    lib_fixture,  # noqa: F401 - the fixture "lib"
    load,
    new_ctx,
    ok,
    state,
)
from harness import HANG
from selftest_library import run_in_fresh_interpreter


# ---------------------------------------------------------------------------
# Declarations vs. the generated header
# ---------------------------------------------------------------------------


def enum_values(text: str) -> dict:
    return {name: int(value, 0) for name, value in re.findall(r"\b(DC_[A-Z_]+)\s*=\s*(0x[0-9a-fA-F]+|\d+)", text)}


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
    """Every dc_* function the test_c_abi*.py files call is in the public header and
    exported (test_public_header_matches_the_exports checks the prototypes), but
    for the test library's hook, which only c_abi.SELFTEST_CDEF declares."""
    if not GENERATED_HEADER_PATH.is_file() or not HEADER_PATH.is_file():
        pytest.skip("headers not built (run `python build.py`)")
    if _header_is_stale():
        pytest.skip("the generated header is older than the Go sources (run `python build.py`)")
    exported = set(re.findall(r"^extern [^(]*?\b(dc_\w+)\(", GENERATED_HEADER_PATH.read_text("utf-8"), re.M))
    declared = set(re.findall(r"\b(dc_\w+)\(", header_cdef(header_text())))
    here = Path(__file__).resolve().parent
    called = {n for f in here.glob("test_c_abi*.py") for n in re.findall(r"\blib\.(dc_\w+)\(", f.read_text("utf-8"))}
    assert len(called) > 20
    # The test library's hooks are declared apart (c_abi.SELFTEST_CDEF).
    assert called - declared == set(re.findall(r"\b(dc_\w+)\(", SELFTEST_CDEF))
    assert declared - exported == set()


def test_public_header_matches_the_exports():
    """The hand-written header declares every export, and only those, with
    cgo's types modulo const (build.py checks the same at every build)."""
    build = _import_build()
    if not GENERATED_HEADER_PATH.is_file() or not HEADER_PATH.is_file():
        pytest.skip("headers not built (run `python build.py`)")
    if _header_is_stale():
        pytest.skip("the generated header is older than the Go sources (run `python build.py`)")
    public = header_text()
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


def _scenario_selftest_panic_is_recovered() -> None:
    lib = load()
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


def test_selftest_panic_is_recovered(selftest_library):
    # The hook is the test library's alone: in a fresh interpreter.
    run_in_fresh_interpreter("test_c_abi", "_scenario_selftest_panic_is_recovered", selftest_library)


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


def test_frontend_settings_are_one_json_value(lib):
    """dc_frontend_check_settings checks what dc_frontend_start would start
    with, one JSON object: a setting given as text is parsed by the library
    and refused naming its source as given (a flag, a variable, else the
    member); what is not such an object, or names a member only up to case,
    is DC_EINVAL; nothing is read from the environment."""
    good = b'{"addr":"127.0.0.1:0","migration_limit":2,"max_body_bytes":{"text":"64","source":"--max-body-bytes"}}'
    ok(lib, lib.dc_frontend_check_settings(good, len(good)))
    for settings, why in (
        (b'{"max_body_bytes":{"text":"0","source":"--max-body-bytes"}}', '--max-body-bytes "0": want a positive number of bytes'),
        (b'{"request_timeout":{"text":"soon","source":"DYNAMO_CTX_REQUEST_TIMEOUT"}}',
         'DYNAMO_CTX_REQUEST_TIMEOUT="soon": "soon" is not a number'),
        (b'{"max_queued_requests":{"text":"-1"}}', 'max_queued_requests="-1": want a number of requests'),
        (b'{"ADDR":"127.0.0.1:0"}', "ADDR"),
        (b'{"max_body_bytes":"64"}', "settings"),
        (b"not json", "settings"),
    ):
        msg = expect(lib, lib.dc_frontend_check_settings(settings, len(settings)), DC_EINVAL, "dc_frontend_check_settings")
        assert why in msg, msg
    expect(lib, lib.dc_frontend_check_settings(ffi.NULL, 0), DC_EINVAL, "dc_frontend_check_settings")
    out = ffi.new("uint64_t *")
    expect(lib, lib.dc_frontend_start(1, ffi.NULL, 0, out), DC_EINVAL, "dc_frontend_start")
    expect(lib, lib.dc_frontend_start(1, good, len(good), ffi.NULL), DC_EINVAL, "dc_frontend_start")
    expect(lib, lib.dc_frontend_start(1, good, len(good), out), DC_EBADF, "dc_frontend_start")


TEST_MODEL = PACKAGE_DIR.parents[1] / "go" / "frontend" / "testdata" / "model"


def test_model_card(lib, tmp_path):
    """dc_model_card: a worker's card as go/modelcard builds and checks it; its bounds and the
    model directory's are the module's constants."""
    import json

    from dynamo_ctx import _native

    if not TEST_MODEL.is_dir():
        pytest.skip("no source tree (an installed wheel)")
    assert (_native.MODEL_CARD_MAX_BYTES, _native.MODEL_MAX_TOKENIZER_BYTES, _native.MODEL_MAX_CONFIG_BYTES) == (
        lib.DC_MODEL_CARD_MAX_BYTES, lib.DC_MODEL_MAX_TOKENIZER_BYTES, lib.DC_MODEL_MAX_CONFIG_BYTES)
    model = tmp_path / "model"
    shutil.copytree(TEST_MODEL, model)
    n = ffi.new("size_t *")
    here = str(model).encode()

    def card(name=b"m", mode=b"agg", limit=1, seqs=0, length=512, path=here, cap=lib.DC_MODEL_CARD_MAX_BYTES + 1, supports=b"",
             tools=b"", reasoning=b""):
        buf = ffi.new("char[]", cap)
        rc = lib.dc_model_card(name, len(name), mode, len(mode), limit, seqs, length, path or ffi.NULL, len(path or b""),
                               supports or ffi.NULL, len(supports), tools or ffi.NULL, len(tools), reasoning or ffi.NULL,
                               len(reasoning), buf, cap, n)
        return rc, ffi.string(buf).decode() if rc == 0 else None

    rc, text = card()
    ok(lib, rc)
    got = json.loads(text)
    assert n[0] == len(text)
    assert got == {"model": "m", "mode": "agg", "migration_limit": 1, "max_model_len": 512, "model_path": str(model),
                   "text_checksum": got["text_checksum"]}
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", got["text_checksum"])
    assert json.loads(_native.model_card("m", "agg", 1, max_model_len=512, model_path=str(model))) == got
    (model / "config.json").write_text("{}")
    assert json.loads(card()[1]) == got, "only the text files count"
    (model / "chat_template.jinja").write_text("{{ messages }}")
    assert json.loads(card()[1])["text_checksum"] != got["text_checksum"]
    assert json.loads(card(path=None)[1]) == {"model": "m", "mode": "agg", "migration_limit": 1, "max_model_len": 512}

    assert json.loads(card(supports=b"top_k,min_tokens")[1])["supports"] == ["top_k", "min_tokens"]
    assert json.loads(_native.model_card("m", "agg", supports="min_p"))["supports"] == ["min_p"]
    parsers = json.loads(card(path=None, tools=b"hermes", reasoning=b"qwen3")[1])
    assert (parsers["tool_call_parser"], parsers["reasoning_parser"]) == ("hermes", "qwen3")
    assert json.loads(_native.model_card("m", "agg", tool_call_parser="llama3_json"))["tool_call_parser"] == "llama3_json"
    assert set(_native.TOOL_CALL_PARSERS.split(",")) >= {"hermes", "llama3_json", "mistral", "deepseek_v3"}
    assert set(_native.REASONING_PARSERS.split(",")) >= {"deepseek_r1", "qwen3"}
    for bad in (dict(mode=b"aggregated"), dict(name=b""), dict(limit=-1), dict(seqs=-1), dict(path=b"relative/model"),
                dict(supports=b"top_k,top_k"), dict(supports=b"temperature"), dict(supports=b"top_k,"),
                dict(tools=b"hermes2"), dict(reasoning=b"r1"), dict(tools=b"hermes,mistral")):
        rc, _ = card(**bad)
        assert "invalid model card" in expect(lib, rc, DC_EINVAL, "dc_model_card"), bad
    expect(lib, card(path=str(tmp_path / "none").encode())[0], lib.DC_EIO, "dc_model_card")
    expect(lib, card(cap=8)[0], DC_ERANGE, "dc_model_card")
    assert n[0] > 8
    buf = ffi.new("char[64]")
    rc = lib.dc_model_card(ffi.NULL, 0, b"agg", 3, 0, 0, 0, ffi.NULL, 0, ffi.NULL, 0, ffi.NULL, 0, ffi.NULL, 0, buf, 64, n)
    expect(lib, rc, DC_EINVAL, "dc_model_card")
