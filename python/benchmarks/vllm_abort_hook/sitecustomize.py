"""bench_vllm_cpu.py's instrument: when DC_ABORT_LOG names a file, every return of vLLM's
``AsyncLLM.abort`` in this process appends ``<wall-clock time> <request ids>`` to it,
and the engine core's process appends the same to ``<that file>.engine`` the moment its
input thread has read an abort (``EngineCore``'s ``aborts_queue``: where the engine
takes aborts between its model's steps), whoever sent it.

With DC_VLLM_SHIM=1 it also lets NVIDIA Dynamo 1.6.1's vLLM worker import on the vLLM
the benchmark runs: Dynamo imports ``get_engine_zmq_addresses`` from
``vllm.v1.engine.utils`` (for its embedding workers only), a name vLLM 0.32 no longer
has; a stand-in that raises is put there.

With DC_CPU_PROBE naming a folder, it counts the CPU time that this process's threads
spend in a few functions on the path of every engine step (``PROBES``: vLLM's output
processing, its stats loggers and message decoding, and our worker's short way around
that processing, its items, its handing over of them and its reading of the engine's
messages that the library forwards), and every half second writes ``<folder>/<pid>.json``: per function, the CPU
seconds and calls so far, the CPU seconds of the main thread (where the event loop
runs), when the record was written, and what one probed call costs the thread beyond
the call itself (``probe_cost_s``, measured once: two ``time.thread_time`` calls and
the wrapper, about a microsecond and a half). bench_vllm_cpu.py's ``breakdown`` phase
reads it and takes that cost out of its figures. The hand-over (``WALL_PROBES``) is
also timed on the wall clock, with the calls in which the thread lost its CPU counted
apart (``getrusage``'s involuntary switches; that probe's own cost is
``wall_probe_cost_s``): its write wakes the library's reader, which may take the
loop's CPU for longer than the call runs. A probed function keeps its own
signature (``functools.wraps``): our worker checks the signature of vLLM's
``process_outputs`` before it takes its short way (backends/vllm_lean.py), and a
probe that hid it would measure vLLM's way instead.

The benchmark puts this folder first on PYTHONPATH of both stacks (vLLM's server, and
our worker), so that the time from a client's close to the engine's abort is taken at
the same place in both. The module is patched when it is first imported (an import
hook), so processes that never import vLLM (our frontend) import nothing more.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import resource
import sys
import threading
import time

_LOG = os.environ.get("DC_ABORT_LOG")
_SHIM = os.environ.get("DC_VLLM_SHIM") == "1"
_TARGET = "vllm.v1.engine.async_llm"
_CORE = "vllm.v1.engine.core"
_UTILS = "vllm.v1.engine.utils"
_PROBE = os.environ.get("DC_CPU_PROBE")

#: What the probe counts: module -> [(class, method, the name it is reported under)].
PROBES = {
    "vllm.v1.engine.output_processor": [("OutputProcessor", "process_outputs", "vllm.process_outputs")],
    "vllm.v1.metrics.loggers": [("StatLoggerManager", "record", "vllm.stats_record")],
    "vllm.v1.serial_utils": [("MsgpackDecoder", "decode", "vllm.msgpack_decode")],
    "dynamo_ctx.serving": [("_Sends", "flush", "ours.flush")],
    "dynamo_ctx.backends.vllm": [("_Pushed", "_put", "ours.put"), ("_Pushed", "tokens", "ours.tokens")],
    "dynamo_ctx.backends.vllm_lean": [("LeanOutputs", "process_outputs", "ours.lean")],
    "dynamo_ctx.backends.vllm_outputs": [("EngineOutputs", "_read", "ours.read")],
}


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


def _patch_core(module) -> None:
    import queue

    engine_log = _LOG + ".engine"

    class LoggedAborts(queue.Queue):
        def put_nowait(self, item):
            t = time.time()
            super().put_nowait(item)
            with open(engine_log, "a") as f:
                f.write(f"{t:.6f} {','.join(item)}\n")

    cls = module.EngineCore
    original = cls.__init__

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.aborts_queue = LoggedAborts()

    cls.__init__ = init


#: The probes that also count wall time and preemption (``_counting``'s ``wall``): a
#: call that wakes another thread may lose its CPU to it, for longer than it runs.
WALL_PROBES = {"ours.flush"}

_counts = {}  # name -> _new_counter(name in WALL_PROBES)
_dumper = []


def _new_counter(wall: bool) -> list:
    """A probe's counts: [CPU seconds, calls], and with ``wall`` also [..., wall
    seconds, preempted calls, their wall seconds] (the layout bench_vllm_cpu.py reads)."""
    return [0.0, 0, 0.0, 0, 0.0] if wall else [0.0, 0]


def _counting(original, counter, wall=False):
    """``original``, counting its thread CPU seconds and calls into ``counter``; with
    ``wall``, also its wall seconds, and the calls in which the thread was preempted
    (``getrusage``'s involuntary switches of the thread) and their wall seconds."""
    now = time.thread_time

    @functools.wraps(original)
    def counted(*args, **kwargs):
        t = now()
        try:
            return original(*args, **kwargs)
        finally:
            counter[0] += now() - t
            counter[1] += 1

    if not wall:
        return counted
    clock, usage, thread = time.perf_counter, resource.getrusage, resource.RUSAGE_THREAD

    @functools.wraps(original)
    def timed(*args, **kwargs):
        switches, w = usage(thread).ru_nivcsw, clock()
        try:
            return counted(*args, **kwargs)
        finally:
            w = clock() - w
            counter[2] += w
            if usage(thread).ru_nivcsw != switches:
                counter[3] += 1
                counter[4] += w

    return timed


def _probe_cost(n: int = 20000, wall: bool = False) -> float:
    """The thread CPU seconds one probed call adds, beyond the call itself."""
    def nothing():
        return None

    counted = _counting(nothing, _new_counter(wall), wall)
    now = time.thread_time
    t = now()
    for _ in range(n):
        nothing()
    bare = now() - t
    t = now()
    for _ in range(n):
        counted()
    return max(0.0, (now() - t - bare) / n)


def _dump_forever() -> None:
    main = threading.main_thread().native_id
    path = os.path.join(_PROBE, f"{os.getpid()}.json")
    tick = os.sysconf("SC_CLK_TCK")
    cost, wall_cost = _probe_cost(), _probe_cost(5000, wall=True)
    while True:
        time.sleep(0.5)
        try:
            with open(f"/proc/self/task/{main}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            record = {"argv": sys.argv, "written_at": time.time(), "probe_cost_s": cost, "wall_probe_cost_s": wall_cost,
                      "main_cpu_s": (int(fields[11]) + int(fields[12])) / tick,
                      "functions": {k: list(v) for k, v in list(_counts.items())}}
            with open(path + ".tmp", "w") as f:
                json.dump(record, f)
            os.replace(path + ".tmp", path)
        except Exception:  # noqa: BLE001 - the next round tries again; the reader sees the record grow stale
            pass


def _probe(module) -> None:
    for cls_name, method, name in PROBES[module.__name__]:
        cls = getattr(module, cls_name, None)
        original = getattr(cls, method, None)
        if original is None:
            continue  # another version: that figure is left out
        wall = name in WALL_PROBES
        setattr(cls, method, _counting(original, _counts.setdefault(name, _new_counter(wall)), wall))
    if not _dumper:
        _dumper.append(threading.Thread(target=_dump_forever, name="dc-cpu-probe", daemon=True))
        _dumper[0].start()


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

        patches = self.patches[name]

        def exec_and_patch(module):
            exec_module(module)
            for patch in patches:
                patch(module)

        loader.exec_module = exec_and_patch
        return spec


_patches = {}
if _LOG:
    _patches.setdefault(_TARGET, []).append(_patch)
    _patches.setdefault(_CORE, []).append(_patch_core)
if _SHIM:
    _patches.setdefault(_UTILS, []).append(_shim)
if _PROBE:
    for _module in PROBES:
        _patches.setdefault(_module, []).append(_probe)
if _patches:
    sys.meta_path.insert(0, _Finder(_patches))
