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
import json, multiprocessing, subprocess, sys, time
from dynamo_ctx.cli import reaper

def engine_main(q):
    # As vLLM's EngineCore does where it can: forked, then starting a process of its own.
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    q.put(p.pid)
    time.sleep(600)

if __name__ == "__main__":
    end, how = sys.argv[1], sys.argv[2]
    r = reaper.start()
    if how == "late":
        # A first poke (the worker's engine ready), then nothing changes for
        # seconds: the reaper's next scan is seconds away when the engine
        # starts, so the worker pokes it again.
        reaper.poke()
        time.sleep(reaper.MAX_SCAN_INTERVAL + 0.5)
    if how == "fork":
        q = multiprocessing.get_context("fork").Queue()
        engine = multiprocessing.get_context("fork").Process(target=engine_main, args=(q,), daemon=False)
        engine.start()
        grandchild = q.get(timeout=30)
    else:
        engine = subprocess.Popen([sys.executable, "-c",
            "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
            " print(p.pid, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
        grandchild = int(engine.stdout.readline())
    if how == "late":
        reaper.poke()
        time.sleep(1.0)  # the poked scan has run; without the poke, the next is due 2 s later
    else:
        time.sleep(4 * reaper.SCAN_INTERVAL + 0.5)  # the reaper has scanned since
    print(json.dumps({"reaper": r.pid, "engine": engine.pid, "grandchild": grandchild}), flush=True)
    if end == "exit":
        sys.stdin.readline()  # the test has seen them all running
        import os
        os._exit(0)  # as a worker ends: its children are not waited for
    time.sleep(600)
"""


def running(pid: int) -> bool:
    """The process runs (not a zombie)."""
    from dynamo_ctx.cli import reaper

    return reaper.start_time(pid) is not None


def start_worker(end: str, how: str, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    p = subprocess.Popen([sys.executable, str(script), end, how], env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    pids = json.loads(p.stdout.readline())
    return p, pids


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the reaper reads /proc")
@pytest.mark.parametrize("how", ["popen", "fork", "late"])
@pytest.mark.parametrize("end", ["sigkill", "exit"])
def test_engine_processes_die_with_the_worker(end, how, tmp_path):
    """However the engine was started (a child that execs, or one forked, which
    inherits the worker's descriptors; or one that execs, started when the
    reaper's scans have grown apart after a first poke, then poked for) and
    however the worker ends."""
    worker, pids = start_worker(end, how, tmp_path)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert all(running(pids[k]) for k in ("reaper", "engine", "grandchild"))
        t0 = time.monotonic()
        if end == "sigkill":
            worker.send_signal(signal.SIGKILL)
        else:
            worker.stdin.write("exit\n")
            worker.stdin.flush()
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


@pytest.mark.parametrize("argv", [["not-a-pid"], ["1"], [str(os.getpid())]])
def test_reaper_refuses_to_reap_for_another_process(argv):
    """Not a pid, the pid of a process that is not its parent, or its parent's pid
    with a standard input that is not a pipe: it refuses, and kills nothing."""
    out = subprocess.run([sys.executable, "-m", "dynamo_ctx.cli.reaper", *argv], env=child_env(),
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG)
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
