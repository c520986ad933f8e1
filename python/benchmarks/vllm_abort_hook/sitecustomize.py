"""bench_vllm_cpu.py's instrument: when DC_ABORT_LOG names a file, every return of vLLM's
``AsyncLLM.abort`` in this process appends ``<wall-clock time> <request ids>`` to it.

With DC_VLLM_SHIM=1 it also lets NVIDIA Dynamo 1.6.1's vLLM worker import on the vLLM
the benchmark runs: Dynamo imports ``get_engine_zmq_addresses`` from
``vllm.v1.engine.utils`` (for its embedding workers only), a name vLLM 0.32 no longer
has; a stand-in that raises is put there.

The benchmark puts this folder first on PYTHONPATH of both stacks (vLLM's server, and
our worker), so that the time from a client's close to the engine's abort is taken at
the same place in both. The module is patched when it is first imported (an import
hook), so processes that never import vLLM (our frontend) import nothing more.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time

_LOG = os.environ.get("DC_ABORT_LOG")
_SHIM = os.environ.get("DC_VLLM_SHIM") == "1"
_TARGET = "vllm.v1.engine.async_llm"
_UTILS = "vllm.v1.engine.utils"


def _shim(module) -> None:
    if not hasattr(module, "get_engine_zmq_addresses"):
        def get_engine_zmq_addresses(*args, **kwargs):
            raise NotImplementedError("get_engine_zmq_addresses is not in this vLLM")

        module.get_engine_zmq_addresses = get_engine_zmq_addresses


def _patch(module) -> None:
    cls = module.AsyncLLM
    original = cls.abort

    async def abort(self, request_id, *args, **kwargs):
        out = await original(self, request_id, *args, **kwargs)
        with open(_LOG, "a") as f:
            f.write(f"{time.time():.6f} {request_id}\n")
        return out

    cls.abort = abort


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        patch = self.patches[name]

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        loader.exec_module = exec_and_patch
        return spec


_patches = {}
if _LOG:
    _patches[_TARGET] = _patch
if _SHIM:
    _patches[_UTILS] = _shim
if _patches:
    sys.meta_path.insert(0, _Finder(_patches))
