"""bench_vllm_cpu.py's instrument: when DC_ABORT_LOG names a file, every return of vLLM's
``AsyncLLM.abort`` in this process appends ``<wall-clock time> <request ids>`` to it.

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
_TARGET = "vllm.v1.engine.async_llm"


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
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
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

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


if _LOG:
    sys.meta_path.insert(0, _Finder())
