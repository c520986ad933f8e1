"""The reaper: an engine's processes die with the worker that started them, SIGKILL included.

A stand-in worker (a fresh interpreter) starts its reaper as the worker command does
(``dynamo_ctx.cli.reaper.start``), then an "engine": a child that starts a grandchild
(as vLLM's EngineCore starts its own worker), each sleeping. Whatever the worker's end,
the reaper kills both within a few seconds and exits; it never kills anything else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from harness import HANG, child_env, wait_until

WORKER = r"""
import json, subprocess, sys, time
from dynamo_ctx.cli import reaper
r = reaper.start()
engine = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
    " print(p.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
grandchild = int(engine.stdout.readline())
time.sleep(2 * reaper.SCAN_INTERVAL + 0.2)  # the reaper has seen them
print(json.dumps({"reaper": r.pid, "engine": engine.pid, "grandchild": grandchild}), flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)
time.sleep(600)
"""


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


def start_worker(end: str):
    p = subprocess.Popen([sys.executable, "-c", WORKER, end], env=child_env(), stdout=subprocess.PIPE, text=True)
    pids = json.loads(p.stdout.readline())
    return p, pids


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the reaper reads /proc")
@pytest.mark.parametrize("end", ["sigkill", "exit"])
def test_engine_processes_die_with_the_worker(end):
    worker, pids = start_worker(end)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert all(running(pids[k]) for k in ("reaper", "engine", "grandchild"))
        t0 = time.monotonic()
        if end == "sigkill":
            worker.send_signal(signal.SIGKILL)
        worker.wait(HANG)
        wait_until(lambda: not running(pids["engine"]) and not running(pids["grandchild"]), "the engine's processes to end", 10)
        took = time.monotonic() - t0
        wait_until(lambda: not running(pids["reaper"]), "the reaper to exit", 10)
        assert running(bystander.pid), "the reaper killed a process that was not the worker's"
        print(f"worker {end}: its engine processes gone {took:.2f} s later")
    finally:
        bystander.kill()
        bystander.wait()
        for k in ("engine", "grandchild", "reaper"):
            try:
                os.kill(pids[k], signal.SIGKILL)
            except OSError:
                pass


def test_reaper_refuses_bad_arguments():
    out = subprocess.run([sys.executable, "-m", "dynamo_ctx.cli.reaper", "not-a-pid"], env=child_env(),
                         capture_output=True, text=True, timeout=HANG)
    assert out.returncode != 0 and "usage" in out.stderr


def test_descendants_and_start_time():
    from dynamo_ctx.cli import reaper

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert child.pid in reaper.descendants([os.getpid()])
        assert reaper.start_time(child.pid) is not None
    finally:
        child.kill()
        child.wait()
    assert reaper.start_time(child.pid) is None
