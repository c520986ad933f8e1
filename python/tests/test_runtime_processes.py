"""The request plane across processes: workers and callers killed with SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from dynamo_ctx import Context, DistributedRuntime, NoResponders, StreamIncomplete
from harness import start_script
from helpers import HANG, run

HERE = Path(__file__).resolve().parent


def unique_path():
    return f"proc{uuid.uuid4().hex[:8]}.worker.generate"


@contextlib.asynccontextmanager
async def ready_worker(nats_url):
    """plane_worker.py serving a fresh path, once it is ready: yields
    (worker, path); the worker is SIGKILLed at the end."""
    path = unique_path()
    worker = start_script(HERE / "plane_worker.py", path, nats_url=nats_url)
    try:
        await worker.event_async("ready")
        yield worker, path
    finally:
        worker.kill()


def test_remote_kill_and_stop(nats_url):
    async def main():
        async with ready_worker(nats_url) as (worker, path):
            rt = DistributedRuntime(nats_url=nats_url)
            client = await rt.endpoint(path).client()
            await client.wait_for_instances()

            assert await _collect(await client.generate({"mode": "count", "n": 5}, annotated=False)) == list(range(5))

            ctx = Context("remote-kill")
            stream = await client.generate({"mode": "wait_kill"}, annotated=False, context=ctx)
            assert await stream.__anext__() == 0
            ctx.kill()
            ev = await worker.event_async("killed")
            assert (ev["id"], ev["reason"], ev["stopped"]) == ("remote-kill", "kill", True)
            rt.shutdown()

    run(main())


def test_caller_death_kills_handler_with_connection_lost(nats_url):
    async def main():
        async with ready_worker(nats_url) as (worker, path):
            caller = start_script(HERE / "plane_caller.py", path, json.dumps({"mode": "wait_kill"}), nats_url=nats_url)
            await caller.event_async("item")
            caller.kill()
            ev = await worker.event_async("killed")
            assert (ev["id"], ev["reason"]) == ("caller-req", "connection_lost")

    run(main())


def test_worker_death_breaks_stream_and_instance_disappears(nats_url):
    async def main():
        path = unique_path()
        worker = start_script(HERE / "plane_worker.py", path, nats_url=nats_url)
        ready = await worker.event_async("ready")
        rt = DistributedRuntime(nats_url=nats_url)
        client = await rt.endpoint(path).client()
        t0 = time.monotonic()
        assert await client.wait_for_instances() == [ready["instance"]]
        appeared = time.monotonic() - t0

        stream = await client.generate({"mode": "forever"}, annotated=False)
        assert await stream.__anext__() == 0
        worker.kill()
        with pytest.raises(StreamIncomplete, match="^Stream ended before generation completed"):
            async for _ in stream:
                pass

        # The dead instance fails fast, then leaves discovery.
        with pytest.raises(NoResponders):
            await client.direct({"mode": "count"}, ready["instance"])
        t1 = time.monotonic()
        while client.instance_ids():
            assert time.monotonic() - t1 < 15, "dead instance still listed"
            await asyncio.sleep(0.05)
        gone = time.monotonic() - t1
        print(f"instance appeared after {appeared:.3f}s, disappeared {gone:.3f}s after SIGKILL")
        rt.shutdown()

    run(main())


async def _collect(stream):
    return [x async for x in stream]


_DEFAULT_SCRIPT = (
    "import asyncio, sys\n"
    "from dynamo_ctx import DistributedRuntime\n"
    "async def handler(request):\n"
    "    yield 'hello from the embedded default'\n"
    "async def main():\n"
    "    rt = DistributedRuntime()\n"
    "    print(rt.nats_url, flush=True)\n"
    "    ep = rt.endpoint('embedded.default.generate')\n"
    "    if sys.argv[1] == 'serve':\n"
    "        t = asyncio.ensure_future(ep.serve_endpoint(handler))\n"
    "        await ep.serving()\n"
    "        print('serving', flush=True)\n"
    "        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)\n"
    "        rt.shutdown(); await t\n"
    "    else:\n"
    "        c = await ep.client(); await c.wait_for_instances()\n"
    "        print([x.data() async for x in await c.generate({})][0], flush=True)\n"
    "        rt.shutdown()\n"
    "asyncio.run(main())\n"
)

# Runs in its own process: the first child hosts NATS at the default address,
# the second joins it. Exit status 0 when both saw what they should. It starts its
# two children itself, not through the harness: it is one command run inside a
# private network namespace (below), where only the interpreter's own modules are at hand.
_DEFAULT_DRIVER = """
import subprocess, sys
script = sys.argv[1]
server = subprocess.Popen([sys.executable, "-c", script, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
try:
    url = server.stdout.readline().strip()
    assert url == "nats://127.0.0.1:4222", url
    assert server.stdout.readline().strip() == "serving"
    out = subprocess.run([sys.executable, "-c", script, "call"], stdout=subprocess.PIPE, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.split("\\n")[:2] == ["nats://127.0.0.1:4222", "hello from the embedded default"], out.stdout
    server.stdin.write("\\n"); server.stdin.flush()
    assert server.wait(60) == 0
    print("ok")
finally:
    if server.poll() is None:
        server.kill()
"""


def _private_network() -> list:
    """A command prefix running its argument in a network namespace of its own
    (so the default address 4222 is this test's alone), or [] when the machine
    does not allow one."""
    import shutil
    import subprocess

    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return []
    prefix = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']
    try:
        ok = subprocess.run(prefix + ["true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return prefix if ok else []


def test_embedded_default_is_shared_by_processes(tmp_path):
    """With no NATS_SERVER, the first process hosts NATS on 127.0.0.1:4222 and the next joins it.

    Run in a private network namespace where the machine allows one, so that
    suites and demos running beside this one keep their 4222; otherwise only
    when nothing answers at 4222."""
    import socket
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "NATS_SERVER"}
    env["PYTHONPATH"] = str(HERE.parent)
    env["DYNAMO_CTX_RUNTIME_DIR"] = str(tmp_path / "rt")
    prefix = _private_network()
    if not prefix:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", 4222)) == 0:
                pytest.skip("127.0.0.1:4222 is in use and no private network namespace is available")
    r = subprocess.run(prefix + [sys.executable, "-c", _DEFAULT_DRIVER, _DEFAULT_SCRIPT], env=env,
                       capture_output=True, text=True, timeout=2 * HANG)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_frozen_callers_deadline_fires_on_the_worker(nats_url):
    """A caller with a deadline, frozen (SIGSTOP) mid-stream: no kill can come from it, and
    the worker's handler is killed with reason deadline by the worker's own timer."""

    async def main():
        async with ready_worker(nats_url) as (worker, path):
            caller = start_script(HERE / "plane_caller.py", path, json.dumps({"mode": "wait_kill"}), "1.5", nats_url=nats_url)
            try:
                await caller.event_async("item")
                caller.freeze()
                t0 = time.monotonic()
                ev = await worker.event_async("killed")
                assert (ev["id"], ev["reason"]) == ("caller-req", "deadline")
                assert time.monotonic() - t0 < 1.5 + 5, "within the deadline plus a generous bound"
            finally:
                caller.thaw()
                caller.kill()

    run(main())
