"""Packaging: hatchling plus build.py's hook make an abi3 manylinux wheel with the
library inside, from the repository and from the sdist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEEL_LIMIT = 12 << 20  # a stripped library compresses to ~7.5 MB


def _hatchling():
    return pytest.importorskip("hatchling.build")


def _native_c_sources():
    """The C files of go/native (the extension module's py_*.c and errors.c),
    relative to the repository."""
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "go" / "native").glob("*.c"))


@pytest.fixture(scope="module")
def wheel_from_sdist(tmp_path_factory):
    """An sdist of the repository, and a wheel built from that sdist alone."""
    hb = _hatchling()
    out = tmp_path_factory.mktemp("dist")
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        sdist = out / hb.build_sdist(str(out))
        with tarfile.open(sdist) as tf:
            tf.extractall(out / "src", filter="data") if sys.version_info >= (3, 12) else tf.extractall(out / "src")
        (src,) = (out / "src").iterdir()
        os.chdir(src)
        wheel = out / hb.build_wheel(str(out))
    finally:
        os.chdir(cwd)
    return sdist, wheel


def test_sdist_has_sources_not_build_products(wheel_from_sdist):
    sdist, _ = wheel_from_sdist
    with tarfile.open(sdist) as tf:
        names = [n.split("/", 1)[1] for n in tf.getnames() if "/" in n]
    for needed in (
        "build.py",
        "go.mod",
        "go.sum",
        "go/native/main.go",
        "go/native/py_native.h",
        "python/dynamo_ctx/__init__.py",
        "LICENSE",
        "README.md",
        *_native_c_sources(),
    ):
        assert needed in names
    assert not [n for n in names if n.endswith(".so")]


def test_wheel_is_abi3_manylinux(wheel_from_sdist):
    _, wheel = wheel_from_sdist
    assert re.fullmatch(r"dynamo_ctx-0\.1\.0-cp39-abi3-manylinux_2_\d+_x86_64\.whl", wheel.name), wheel.name
    assert wheel.stat().st_size < WHEEL_LIMIT
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = zf.read("dynamo_ctx-0.1.0.dist-info/METADATA").decode()
        wheel_meta = zf.read("dynamo_ctx-0.1.0.dist-info/WHEEL").decode()
    for needed in (
        "dynamo_ctx/_native.abi3.so",
        "dynamo_ctx/include/dynamo_ctx.h",
        "dynamo_ctx/include/dynamo_ctx_services.h",
        "dynamo_ctx/py.typed",
        "dynamo_ctx/_native.pyi",
        "dynamo_ctx-0.1.0.dist-info/licenses/LICENSE",
    ):
        assert needed in names
    version = re.search(r"^Metadata-Version: (\d+)\.(\d+)$", meta, re.M)
    assert version and (int(version[1]), int(version[2])) >= (2, 4)
    assert "License-Expression: Apache-2.0" in meta
    assert "Provides-Extra: demo" in meta
    assert "Root-Is-Purelib: false" in wheel_meta


def test_auditwheel_agrees(wheel_from_sdist):
    _, wheel = wheel_from_sdist
    if shutil.which("auditwheel") is None and not (Path(sys.executable).parent / "auditwheel").exists():
        pytest.skip("auditwheel not installed")
    exe = shutil.which("auditwheel") or str(Path(sys.executable).parent / "auditwheel")
    out = subprocess.run([exe, "show", str(wheel)], capture_output=True, text=True, check=True).stdout
    tag = re.search(r"manylinux_2_\d+_x86_64", wheel.name)[0]
    assert f'consistent\nwith the following platform tag: "{tag}"' in out or f'with the following platform tag: "{tag}"' in out, out


def test_library_is_stripped():
    import dynamo_ctx

    lib = Path(dynamo_ctx.__file__).parent / "_native.abi3.so"
    if shutil.which("readelf") is None:
        pytest.skip("readelf not available")
    sections = subprocess.run(["readelf", "-S", "-W", str(lib)], capture_output=True, text=True, check=True).stdout
    assert ".symtab" not in sections and ".debug_info" not in sections


def test_library_is_the_extension_module():
    import dynamo_ctx

    lib = Path(dynamo_ctx.__file__).parent / "_native.abi3.so"
    assert lib.exists()
    from dynamo_ctx._lib import native

    assert Path(native().__file__).resolve() == lib.resolve()


def test_shipped_library_has_no_test_hooks():
    """The panic self-test is the test library's alone (build.py --selftest,
    -tags dc_selftest): the shipped library neither exports nor names it, and
    its header does not declare it."""
    import ctypes

    import dynamo_ctx

    pkg = Path(dynamo_ctx.__file__).parent
    lib = pkg / "_native.abi3.so"
    assert b"selftest" not in lib.read_bytes()
    for header in ("dynamo_ctx.h", "dynamo_ctx_services.h"):
        assert "selftest" not in (pkg / "include" / header).read_text("utf-8")
    assert not hasattr(ctypes.CDLL(str(lib)), "dc_selftest_panic")
    if shutil.which("nm") is not None:
        out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
        assert "dc_version" in out and "selftest" not in out


def test_python_symbols_are_weak():
    """The library must load without an interpreter: no strong Python symbol."""
    import dynamo_ctx

    if shutil.which("nm") is None:
        pytest.skip("nm not available")
    lib = Path(dynamo_ctx.__file__).parent / "_native.abi3.so"
    out = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    strong = [line.split()[-1] for line in out.splitlines() if line.split()[-1].lstrip("_").startswith("Py") and line.split()[0] == "U"]
    assert strong == [], f"add '#pragma weak' for these in go/native/py_native.h: {strong}"


def test_every_module_file_sees_the_weak_symbols_and_the_guard():
    """Each C file of the extension module includes py_native.h (the weak
    Python symbols, the __has_include(<Python.h>) guard) before anything
    else, and compiles to nothing without Python.h: so the library builds
    and loads without an interpreter, whichever file a Python call is in."""
    native = ROOT / "go" / "native"
    files = sorted(native.glob("py_*.c"))
    assert len(files) >= 5, files
    for f in files:
        text = f.read_text("utf-8")
        code = [line for line in text.splitlines() if line.strip() and not line.startswith("//")]
        assert text.startswith("// " + f.name + ": "), f"{f.name}: its first comment states its one job"
        assert code[:2] == ['#include "py_native.h"', "#ifdef DC_WITH_PYTHON"], f.name
        assert code[-1] == "#endif // DC_WITH_PYTHON", f.name
        assert "Python.h" not in text, f"{f.name}: include py_native.h, not Python.h"
    for f in native.glob("*.c"):
        if f.name.startswith("py_"):
            continue
        assert "Python.h" not in f.read_text("utf-8") and "py_native.h" not in f.read_text("utf-8"), f.name
    header = (native / "py_native.h").read_text("utf-8")
    assert "__has_include(<Python.h>)" in header and "#pragma weak" in header


def test_removing_a_go_file_makes_the_library_stale(tmp_path, monkeypatch):
    """build.py rebuilds when a Go file is removed: a removal changes only its
    folder's mtime, so the folders count among the inputs."""
    sys.path.insert(0, str(ROOT))
    try:
        import build
    finally:
        sys.path.remove(str(ROOT))
    pkg = tmp_path / "go" / "pkg"
    pkg.mkdir(parents=True)
    (tmp_path / "go.mod").write_text("module x\n")
    extra = pkg / "extra.go"
    extra.write_text("package pkg\n")
    (pkg / "a.go").write_text("package pkg\n")
    lib, header = tmp_path / "lib.so", tmp_path / "lib.h"
    monkeypatch.setattr(build, "ROOT", tmp_path)
    past = 1_000_000_000
    for p in [tmp_path / "go.mod", extra, pkg / "a.go", pkg, tmp_path / "go"]:
        os.utime(p, (past, past))
    lib.write_bytes(b"")
    header.write_bytes(b"")
    assert build._is_up_to_date(lib, header)
    extra.unlink()
    assert not build._is_up_to_date(lib, header)
