"""The build backend produces an abi3 platform wheel with the library inside."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_backend():
    spec = importlib.util.spec_from_file_location("dynamo_ctx_build_backend", ROOT / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_wheel_is_abi3_platform_wheel(tmp_path):
    backend = load_backend()
    name = backend.build_wheel(str(tmp_path))
    assert name.startswith("dynamo_ctx-0.1.0-cp39-abi3-")
    assert not name.endswith("none-any.whl")
    with zipfile.ZipFile(tmp_path / name) as zf:
        names = set(zf.namelist())
        wheel_meta = zf.read("dynamo_ctx-0.1.0.dist-info/WHEEL").decode()
    assert "dynamo_ctx/_native.abi3.so" in names
    assert "dynamo_ctx/py.typed" in names
    assert "dynamo_ctx/_native.pyi" in names
    assert "Root-Is-Purelib: false" in wheel_meta
    assert "Tag: cp39-abi3-" in wheel_meta


def test_library_is_the_extension_module():
    import dynamo_ctx

    lib = Path(dynamo_ctx.__file__).parent / "_native.abi3.so"
    assert lib.exists()
    from dynamo_ctx._lib import native

    assert Path(native().__file__).resolve() == lib.resolve()


def test_python_symbols_are_weak():
    """The library must load without an interpreter: no strong Python symbol."""
    import shutil
    import subprocess

    import dynamo_ctx
    import pytest

    if shutil.which("nm") is None:
        pytest.skip("nm not available")
    lib = Path(dynamo_ctx.__file__).parent / "_native.abi3.so"
    out = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    strong = [line.split()[-1] for line in out.splitlines() if line.split()[-1].lstrip("_").startswith("Py") and line.split()[0] == "U"]
    assert strong == [], f"add '#pragma weak' for these in go/native/pymodule.c: {strong}"
