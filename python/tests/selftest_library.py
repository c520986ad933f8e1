"""The test library: the shipped library built with ``-tags dc_selftest``
(``python build.py --selftest``), which adds the panic self-test the shipped
one must not carry: the export dc_selftest_panic and the extension module's
``selftest_panic`` (go/native/selftest_exports.go).

Two Go runtimes cannot share a process, so the tests that need the hook run
in a fresh interpreter that loads the test library instead of the shipped
one: ``run_in_fresh_interpreter`` (test_c_abi*.py: the C ABI through cffi)
and ``run_with_test_module`` (the extension module, as
``dynamo_ctx._native``). The fixture ``selftest_library`` (conftest.py)
builds it once per session, into build/selftest/ (rebuilt only when a file
under go/ changed, like the shipped library).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Union

import pytest

from harness import ROOT, TESTS_DIR, child_env, run_python

#: Set in a fresh interpreter to the test library's path: c_abi.load() then
#: loads it, with dc_selftest_panic declared.
ENV = "DC_SELFTEST_LIBRARY"


def build() -> Path:
    """The test library, built if stale; needs the source tree (build.py)."""
    if not (ROOT / "build.py").is_file() or not (ROOT / "go").is_dir():
        pytest.skip("the test library is built from the source tree (build.py, go/), which is not here")
    spec = importlib.util.spec_from_file_location("_dc_build", ROOT / "build.py")
    assert spec is not None and spec.loader is not None
    build_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_py)
    try:
        return Path(build_py.build_library(selftest=True))
    except build_py.BuildError as e:
        pytest.fail(f"could not build the test library: {e}")


def _run(code: str, library: Path, what: str) -> None:
    proc = run_python("-c", code, env=child_env(**{ENV: str(library)}))
    assert proc.returncode == 0 and proc.stdout.strip() == "done", (
        f"{what} failed in a fresh interpreter (exit {proc.returncode}):\n{proc.stderr}"
    )
    # The library never writes to stdout/stderr itself.
    assert proc.stderr == "", proc.stderr


def run_in_fresh_interpreter(module: str, function: str, library: Path) -> None:
    """Run ``module``'s ``function`` (a module of this directory) in a new
    Python process where c_abi.load() dlopens the test library at
    ``library``, and nothing loads the shipped one.

    A fresh process also gives the log queue's tests a queue of their own: it
    is process-wide, and once the dynamo_ctx Python binding is loaded its
    daemon thread drains it, so what this process's queue holds depends on
    which tests ran before."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(TESTS_DIR)!r})\n"
        f"import {module}\n"
        f"{module}.{function}()\n"
        "assert 'dynamo_ctx._native' not in sys.modules\n"
        "print('done')\n"
    )
    _run(code, library, function)


def install_test_module(library: Union[str, Path]) -> ModuleType:
    """Import the test library as ``dynamo_ctx._native``, before anything
    imports the shipped one: call it first in a fresh interpreter."""
    import dynamo_ctx

    assert "dynamo_ctx._native" not in sys.modules, "the shipped library is loaded already"
    spec = importlib.util.spec_from_file_location("dynamo_ctx._native", library)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dynamo_ctx._native"] = mod
    spec.loader.exec_module(mod)
    dynamo_ctx._native = mod  # type: ignore[attr-defined]
    return mod


def run_with_test_module(module: str, function: str, library: Path) -> None:
    """Run ``module``'s ``function`` in a new Python process whose
    ``dynamo_ctx._native`` is the test library at ``library``."""
    code = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(TESTS_DIR)!r})\n"
        "import selftest_library\n"
        f"selftest_library.install_test_module(os.environ[{ENV!r}])\n"
        f"import {module}\n"
        "from dynamo_ctx._lib import native\n"
        f"assert native().__file__ == os.environ[{ENV!r}], native().__file__\n"
        f"{module}.{function}()\n"
        "print('done')\n"
    )
    _run(code, library, function)
