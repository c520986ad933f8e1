"""The extension module dynamo_ctx._native as the package loads it: the
Python functions it calls are told to dynamo_ctx._lib by the package's
__init__ and registered when _lib loads the module (its C code imports no
Python module), and the package reads the library's constants
(states, the state word's layout) from it rather than restating them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dynamo_ctx
from dynamo_ctx import Context
from harness import run_python


def _run_fresh(code: str) -> str:
    out = run_python("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return out.stdout.strip()


def test_errors_before_and_after_the_package_registers_its_callbacks():
    """Loaded behind the package's back, the module raises RuntimeError with
    the library's message and code (there is no table yet); once dynamo_ctx
    loads it, the same error is the exception errors.py's table gives."""
    code = (
        "from dynamo_ctx import _native\n"
        "try:\n"
        "    _native.endpoint_path_check('no dots')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, '(code %d)' % _native.EINVAL in str(e))\n"
        "from dynamo_ctx._lib import native\n"
        "assert native() is _native\n"
        "try:\n"
        "    _native.endpoint_path_check('no dots')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, getattr(e, 'code_name', None))\n"
    )
    assert _run_fresh(code).splitlines() == ["RuntimeError True", "ValueError EINVAL"]


def test_every_road_to_the_library_registers_the_table():
    """Importing only dynamo_ctx._lib (or a command's module) still runs the
    package's __init__, which tells _lib the callbacks: the first error the
    library raises is already the table's."""
    code = (
        "import sys\n"
        "import dynamo_ctx._lib as _lib\n"
        "assert 'dynamo_ctx._native' not in sys.modules\n"
        "try:\n"
        "    _lib.native().endpoint_path_check('no dots')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, getattr(e, 'code_name', None))\n"
    )
    assert _run_fresh(code) == "ValueError EINVAL"


def test_callbacks_set_after_loading_are_registered_at_once():
    from dynamo_ctx import _aio, errors
    from dynamo_ctx._lib import native, set_callbacks

    lib = native()
    set_callbacks(exception_for=lambda code, message: KeyError(message), flush_local=_aio._flush_local)
    try:
        with pytest.raises(KeyError):
            lib.endpoint_path_check("no dots")
    finally:
        set_callbacks(exception_for=errors._exception_for, flush_local=_aio._flush_local)
    with pytest.raises(ValueError):
        lib.endpoint_path_check("no dots")


def test_the_registered_table_makes_the_exceptions():
    from dynamo_ctx._lib import native

    lib = native()
    with pytest.raises(ValueError) as e:
        lib.endpoint_path_check("no dots")
    assert e.value.code == lib.EINVAL and e.value.code_name == "EINVAL"  # type: ignore[attr-defined]


def test_register_callbacks_wants_callables():
    from dynamo_ctx._lib import native

    lib = native()
    with pytest.raises(TypeError, match="callable"):
        lib._register_callbacks(exception_for=None, flush_local=lambda: None)
    with pytest.raises(TypeError, match="callable"):
        lib._register_callbacks(exception_for=lambda code, msg: ValueError(msg), flush_local=lambda: None, local_queue=1)
    with pytest.raises(TypeError):
        lib._register_callbacks(lambda code, msg: ValueError(msg))  # flush_local missing


def test_a_cancel_calls_the_registered_flush():
    """A cancel made by this thread calls the registered flush_local (the
    package's delivers what the cancel woke on the running loop) with the
    ticket of the wake-ups it held: 0, none, for a context only Python
    waits on."""
    from dynamo_ctx import _lib, errors
    from dynamo_ctx._lib import native

    lib = native()
    calls = []
    ctx = Context()
    ctx.child()  # the parent now has its Go side: its cancel goes to the library
    lib._register_callbacks(exception_for=errors._exception_for, flush_local=lambda ticket: calls.append(ticket))
    try:
        ctx.kill()
    finally:
        lib._register_callbacks(**_lib._callbacks)
    assert calls == [0]
    assert ctx.is_killed()


def test_the_state_words_layout_is_the_librarys():
    from dynamo_ctx._lib import native

    lib = native()
    ctx = Context()
    ctx._cancel(lib.STOPPED, lib.REASON_DEADLINE)
    w = ctx._state_word()
    assert w & lib.STATE_MASK == lib.STOPPED
    assert (w >> lib.REASON_SHIFT) & lib.FIELD_MASK == lib.REASON_DEADLINE
    assert (w >> lib.CAUSE_SHIFT) & lib.FIELD_MASK == lib.REASON_DEADLINE
    child = Context()
    ctx.link_child(child)
    cw = child._state_word()
    assert (cw >> lib.REASON_SHIFT) & lib.FIELD_MASK == lib.REASON_PARENT
    assert (cw >> lib.CAUSE_SHIFT) & lib.FIELD_MASK == lib.REASON_DEADLINE
    assert child.reason() == "parent"


def _imports(module: str) -> set:
    tree = ast.parse((Path(dynamo_ctx.__file__).parent / module).read_text("utf-8"))
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}


def test_context_and_aio_restate_no_state_values_and_import_no_circle():
    """context.py and _aio.py take the states and the word's layout from
    _native (no STOPPED = 1, no 0xff), and _aio.py imports no module of the
    package but _lib, so context.py imports it at the top."""
    pkg = Path(dynamo_ctx.__file__).parent
    for module in ("context.py", "_aio.py"):
        text = pkg.joinpath(module).read_text("utf-8")
        tree = ast.parse(text)
        assigned = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        assert not assigned & {"LIVE", "STOPPED", "KILLED"}, module
        assert "0xff" not in text.lower(), module
    assert _imports("_aio.py") == {"_lib"}
    assert "_aio" in _imports("context.py")
