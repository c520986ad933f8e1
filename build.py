#!/usr/bin/env python3
"""The Go build of dynamo-ctx: what the project adds to a standard build backend.

The core of dynamo-ctx is a Go library compiled with ``go build
-buildmode=c-shared`` into a single shared object that doubles as the CPython
extension module ``dynamo_ctx._native`` (stable ABI, Py_LIMITED_API 3.9).
Packaging (metadata, wheel, sdist, editable installs) is hatchling's; this file
is its custom build hook (pyproject.toml, ``[tool.hatch.build.targets.wheel.
hooks.custom]``): it builds the library in place and gives the wheel its tag,
``cp39-abi3-manylinux_2_<N>_<arch>``, where N is the newest glibc symbol
version the library needs (the equivalent of ``auditwheel repair`` for a
library that links nothing but the C library).

Script usage (from anywhere)::

    python build.py                 # build python/dynamo_ctx/_native.abi3.so if stale
    python build.py --force         # always rebuild
    python build.py --print-lib     # build if stale, then print the library path
    python build.py --print-tag     # the wheel tag the hook would give
    python build.py --selftest      # the test library instead: build/selftest/_native.abi3.so

The test library is the shipped one built with ``-tags dc_selftest``: it adds
the panic self-test (dc_selftest_panic, and selftest_panic in the extension
module; go/native/selftest_exports.go), which the shipped library must not
carry. Only the tests load it (python/tests/selftest_library.py).

Wheels and sdists: ``pip wheel .``, ``pip install .``, ``pip install -e .``, or
``python -m build``. Only the standard library is needed to run this file;
hatchling is imported only when it is the build hook.
"""

from __future__ import annotations

import importlib.machinery
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional

ROOT = Path(__file__).resolve().parent
PACKAGE = "dynamo_ctx"
PACKAGE_DIR = Path("python") / PACKAGE
GO_PACKAGE = "./go/native"
EXT_SUFFIX = ".abi3.so"
LIB_NAME = "_native" + EXT_SUFFIX
GO_HEADER_NAME = "_native.abi3.h"  # what `go build -o _native.abi3.so` writes: internal, not shipped
PUBLIC_HEADER = Path("go") / "native" / "dynamo_ctx.h"  # the hand-written public header
# The public header and the one it includes (the host's services), shipped together.
PUBLIC_HEADERS = (PUBLIC_HEADER, Path("go") / "native" / "dynamo_ctx_services.h")
HEADER_RELPATH = Path("include") / "dynamo_ctx.h"  # where the public header is shipped
ABI_TAG = "cp39-abi3"
SELFTEST_TAG = "dc_selftest"  # the Go build tag of the test library's hooks
SELFTEST_EXPORTS = frozenset({"dc_selftest_panic"})  # its exports the public header leaves out
SELFTEST_DIR = Path("build") / "selftest"  # where --selftest puts the test library
FALLBACK_GO = Path("/usr/local/go/bin/go")

_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox", ".venv", "venv"}


class BuildError(RuntimeError):
    """A build failure with a message meant for humans."""


def _log(msg: str) -> None:
    print(f"build.py: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Native library
# ---------------------------------------------------------------------------


def _resolve(path: Path) -> Path:
    path = Path(path)
    return path if path.is_absolute() else ROOT / path


def library_path(out_dir: Path = PACKAGE_DIR) -> Path:
    """Path of the shared library / extension module inside ``out_dir``."""
    return _resolve(out_dir) / LIB_NAME


def _iter_files(top: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            yield Path(dirpath) / name


def _go_inputs() -> List[Path]:
    """The build's inputs, and the folders that hold them: removing or renaming
    a file changes only its folder's mtime."""
    inputs = [ROOT / "go.mod", ROOT / "go.sum"]
    inputs = [p for p in inputs if p.is_file()]
    go_dir = ROOT / "go"
    if go_dir.is_dir():
        files = [p for p in _iter_files(go_dir) if p.is_file()]
        inputs.extend(files)
        inputs.extend(sorted({p.parent for p in files} | {go_dir}))
    return inputs


def _is_up_to_date(lib: Path, header: Path) -> bool:
    if not lib.is_file() or not header.is_file():
        return False
    lib_mtime = lib.stat().st_mtime_ns
    return all(p.stat().st_mtime_ns < lib_mtime for p in _go_inputs())


def _required_go_version() -> str:
    try:
        m = re.search(r"^go\s+(\S+)", (ROOT / "go.mod").read_text("utf-8"), re.M)
    except OSError:
        return ""
    return m.group(1) if m else ""


def find_go() -> str:
    """Locate the ``go`` executable or raise BuildError."""
    go = shutil.which("go")
    if go:
        return go
    if FALLBACK_GO.is_file() and os.access(FALLBACK_GO, os.X_OK):
        return str(FALLBACK_GO)
    want = _required_go_version()
    raise BuildError(
        "Go toolchain not found: 'go' is not on PATH and "
        f"{FALLBACK_GO} does not exist. dynamo-ctx needs Go"
        f"{' >= ' + want if want else ''} (with cgo and a C compiler) to build "
        "its native library; install it from https://go.dev/dl/ and make sure "
        "'go' is on PATH."
    )


def python_include_dir() -> Path:
    """Directory holding Python.h for the running interpreter, or BuildError."""
    inc = Path(sysconfig.get_paths()["include"])
    if not (inc / "Python.h").is_file():
        ver = "%d.%d" % sys.version_info[:2]
        raise BuildError(
            f"Python development headers not found: {inc / 'Python.h'} does not "
            f"exist. Install the headers for Python {ver} (e.g. "
            f"'apt install python{ver}-dev' on Debian/Ubuntu or "
            f"'dnf install python{ver}-devel' on Fedora) and retry."
        )
    return inc


def _check_platform() -> None:
    if not sys.platform.startswith("linux"):
        raise BuildError(
            f"dynamo-ctx builds on Linux only (this is {sys.platform}): the library is linked "
            "with GNU ld options (go/native/main.go) and its wheel carries a manylinux tag"
        )


def _check_extension_suffix() -> None:
    if EXT_SUFFIX not in importlib.machinery.EXTENSION_SUFFIXES:
        raise BuildError(
            f"this interpreter ({sys.implementation.name} {sys.version.split()[0]}, "
            f"{sysconfig.get_platform()}) cannot load stable-ABI extension modules "
            f"ending in {EXT_SUFFIX!r} (supported suffixes: "
            f"{importlib.machinery.EXTENSION_SUFFIXES}); dynamo-ctx needs a "
            "regular (non free-threaded) CPython >= 3.9 on a Unix-like platform."
        )


def _join_flags(existing: Optional[str], *extra: str) -> str:
    parts = [existing.strip()] if existing and existing.strip() else []
    parts.extend(extra)
    return " ".join(parts)


def build_library(out_dir: Optional[Path] = None, force: bool = False, selftest: bool = False) -> Path:
    """Compile the Go core into ``<out_dir>/_native.abi3.so``.

    Also copies the public headers (go/native/dynamo_ctx.h and the one it
    includes, PUBLIC_HEADERS) to ``<out_dir>/include/`` once their prototypes
    are checked against the ones cgo generated (see check_header); the
    generated header stays beside the library, internal.
    With ``selftest`` it builds the test library instead (``-tags
    dc_selftest``; out_dir defaults to build/selftest): its exports are the
    public header's plus SELFTEST_EXPORTS, and no header is copied.
    The build is skipped when the library (and header) are newer than every
    file under go/ plus go.mod/go.sum, unless ``force`` is true.  Returns the
    absolute path of the library.
    """
    _check_platform()
    _check_extension_suffix()
    out = _resolve(out_dir if out_dir is not None else SELFTEST_DIR if selftest else PACKAGE_DIR)
    lib = out / LIB_NAME
    header = out / (GO_HEADER_NAME if selftest else HEADER_RELPATH)
    if not force and _is_up_to_date(lib, header):
        _log(f"{_display(lib)} is up to date")
        return lib

    go = find_go()
    include = python_include_dir()
    out.mkdir(parents=True, exist_ok=True)

    env = dict(os.environ)
    env["CGO_ENABLED"] = "1"
    env["CGO_CFLAGS"] = _join_flags(env.get("CGO_CFLAGS"), f"-I{include}", "-O2")
    # Python symbols are left undefined (go/native/main.go passes GNU ld's
    # --unresolved-symbols=ignore-all); the interpreter provides them at import.
    # -s -w: no symbol table or DWARF, which would more than double the size.
    tags = [f"-tags={SELFTEST_TAG}"] if selftest else []
    cmd = [go, "build", "-buildmode=c-shared", "-trimpath", *tags, "-ldflags=-s -w", "-o", _display(lib), GO_PACKAGE]
    _log("CGO_CFLAGS=%r" % env["CGO_CFLAGS"])
    _log("running: " + " ".join(cmd))
    try:
        # stdout goes to stderr so that `--print-lib` output stays clean.
        proc = subprocess.run(cmd, cwd=str(ROOT), env=env, stdout=sys.stderr)
    except OSError as exc:
        raise BuildError(f"could not run {go!r}: {exc}") from exc
    if proc.returncode != 0:
        raise BuildError(f"go build failed with exit status {proc.returncode} (command: {' '.join(cmd)})")

    generated = out / GO_HEADER_NAME
    if not generated.is_file():
        raise BuildError(f"go build did not produce the header {generated}")
    if not lib.is_file():
        raise BuildError(f"go build did not produce {lib}")
    problems = check_header(public_header_text(), generated.read_text("utf-8"), SELFTEST_EXPORTS if selftest else ())
    if problems:
        names = " and ".join(str(h) for h in PUBLIC_HEADERS)
        raise BuildError(f"{names} do not match the exports:\n  " + "\n  ".join(problems))
    if selftest:
        os.utime(lib)  # newer than the header cgo wrote with it, for the mtime check
        _log(f"built the test library {_display(lib)}")
        return lib
    header.parent.mkdir(parents=True, exist_ok=True)
    for public in PUBLIC_HEADERS:
        shutil.copyfile(ROOT / public, header.parent / public.name)
    # Keep lib strictly newer than the header move for the mtime check.
    os.utime(lib)
    _log(f"built {_display(lib)} and {_display(header)}")
    return lib


def public_header_text() -> str:
    """The public headers' text, one after the other (what a C user's
    ``#include "dynamo_ctx.h"`` declares)."""
    return "\n".join((ROOT / h).read_text("utf-8") for h in PUBLIC_HEADERS)


_PROTO = re.compile(r"^(?:extern\s+)?([A-Za-z_][\w\s\*]*?)\b(dc_\w+)\(([^)]*)\);", re.M)


def _c_type(decl: str, with_name: bool) -> str:
    """A declaration's type with const, spacing and (if with_name) the
    parameter name dropped: "const char *id" -> "char*"."""
    decl = re.sub(r"\bconst\b", " ", decl)
    if with_name:
        decl = re.sub(r"\w+\s*$", "", decl.strip())
    return re.sub(r"\s+", "", decl)


def prototypes(text: str) -> Dict[str, tuple]:
    """The dc_* prototypes declared in a C header: name -> (return type,
    parameter types), types modulo const."""
    out = {}
    for ret, name, params in _PROTO.findall(text):
        ps = [] if params.strip() in ("", "void") else [_c_type(p, True) for p in params.split(",")]
        out[name] = (_c_type(ret, False), tuple(ps))
    return out


def check_header(public: str, generated: str, undeclared: Iterable[str] = ()) -> List[str]:
    """Where the public header's prototypes differ from cgo's (names, arity,
    types modulo const); the library's internal helpers (dc_set_error,
    dc_copy_error) are not exports and are ignored, and so are the exports
    named in ``undeclared`` (the test library's hooks, SELFTEST_EXPORTS): so
    in the shipped library a hook is an export the header does not declare,
    an error."""
    skip = set(undeclared)
    want = {
        n: p
        for n, p in prototypes(generated).items()
        if n not in skip and re.search(r"^extern\b[^\n]*\b%s\(" % n, generated, re.M)
    }
    have = prototypes(public)
    problems = [f"{n}: exported but not declared" for n in sorted(set(want) - set(have))]
    problems += [f"{n}: declared but not exported" for n in sorted(set(have) - set(want))]
    problems += [f"{n}: {have[n]} != exported {want[n]}" for n in sorted(set(have) & set(want)) if have[n] != want[n]]
    return problems


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------
# Wheel tag
# ---------------------------------------------------------------------------


def glibc_requirement(lib: Path) -> Optional[tuple]:
    """The newest GLIBC_x.y symbol version ``lib`` needs, from ``objdump -T``,
    or None when objdump is missing (then the tag is the plain linux one)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return None
    out = subprocess.run([objdump, "-T", str(lib)], capture_output=True, text=True, check=True).stdout
    versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", out)}
    return max(versions)[:2] if versions else (2, 17)


def platform_tag(lib: Path) -> str:
    arch = platform.machine()
    need = glibc_requirement(lib)
    if need is None:
        return sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"manylinux_{need[0]}_{need[1]}_{arch}"


def wheel_tag(lib: Path) -> str:
    return f"{ABI_TAG}-{platform_tag(lib)}"


# ---------------------------------------------------------------------------
# hatchling build hook
# ---------------------------------------------------------------------------

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script: no hatchling needed
    BuildHookInterface = object  # type: ignore[assignment,misc]


class GoBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    """Builds the library before hatchling packs the wheel (normal or editable)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: Dict[str, Any]) -> None:
        lib = build_library()
        build_data["pure_python"] = False
        build_data["infer_tag"] = False
        build_data["tag"] = wheel_tag(lib)
        if version != "editable":
            # Build products are git-ignored, so hatchling would skip them.
            build_data["force_include"][str(lib)] = f"{PACKAGE}/{LIB_NAME}"
            for public in PUBLIC_HEADERS:
                shipped = HEADER_RELPATH.parent / public.name
                build_data["force_include"][str(lib.parent / shipped)] = f"{PACKAGE}/{shipped.as_posix()}"


# ---------------------------------------------------------------------------
# Script
# ---------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="build.py", description="Build the dynamo-ctx native library in place.")
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p.add_argument("--print-lib", action="store_true", help="print the library path")
    p.add_argument("--print-tag", action="store_true", help="print the wheel tag")
    p.add_argument("--selftest", action="store_true", help=f"build the test library (-tags {SELFTEST_TAG}) into {SELFTEST_DIR}")
    args = p.parse_args(argv)
    try:
        lib = build_library(force=args.force, selftest=args.selftest)
    except BuildError as e:
        print(f"build.py: error: {e}", file=sys.stderr)
        return 1
    if args.print_lib:
        print(lib)
    if args.print_tag:
        print(wheel_tag(lib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
