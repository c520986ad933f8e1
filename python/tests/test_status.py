"""The library's status listener as Python serves routes with it (dynamo_ctx.status):
answers rendered on the event loop, methods and paths, a route that raises, a loop that
does not answer in time, closing (in process)."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from typing import Dict, Tuple

import pytest

from dynamo_ctx._lib import native
from dynamo_ctx.status import TEXT, StatusServer, bind


def fetch(url: str, method: str = "GET") -> Tuple[int, Dict[str, str], bytes]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_routes_are_answered_on_the_loop():
    scrapes = []

    def metrics():
        scrapes.append(time.monotonic())
        return 200, "text/plain; version=0.0.4", f"scrapes {len(scrapes)}\n".encode()

    def broken():
        raise RuntimeError("a bug in a route")

    async def main():
        server = StatusServer(bind("127.0.0.1", 0), {"/metrics": metrics, "/broken": broken, "/down": lambda: (503, TEXT, b"no\n")})
        server.start()
        base = f"http://{server.address}"
        get = lambda *a: asyncio.get_running_loop().run_in_executor(None, fetch, *a)  # noqa: E731
        try:
            status, headers, body = await get(f"{base}/metrics")
            assert (status, headers["Content-Type"], body) == (200, "text/plain; version=0.0.4", b"scrapes 1\n")
            assert (await get(f"{base}/metrics?x=1"))[2] == b"scrapes 2\n", "rendered at each scrape"
            status, headers, body = await get(f"{base}/metrics", "HEAD")
            assert (status, body, int(headers["Content-Length"])) == (200, b"", len(b"scrapes 3\n"))
            assert (await get(f"{base}/down"))[:1] == (503,)
            status, headers, body = await get(f"{base}/metrics", "POST")
            assert (status, headers["Allow"], body) == (405, "GET, HEAD", b"method not allowed\n")
            assert (await get(f"{base}/nope"))[0::2] == (404, b"not found\n")
            assert (await get(f"{base}/broken"))[0::2] == (500, b"internal error\n")
            assert (await get(f"{base}/metrics"))[0] == 200, "the loop still answers"
        finally:
            server.close()
            server.close()  # idempotent

    asyncio.run(main())


def test_a_loop_that_does_not_answer_in_time_gets_503_not_a_hang():
    def slow():
        time.sleep(1.0)  # the loop is stuck
        return 200, TEXT, b"late\n"

    async def main():
        server = StatusServer(bind("127.0.0.1", 0), {"/slow": slow}, answer_timeout=0.2)
        server.start()
        try:
            started = time.monotonic()
            status, _, body = await asyncio.get_running_loop().run_in_executor(None, fetch, f"http://{server.address}/slow")
            assert status == 503 and b"no answer within" in body
            assert time.monotonic() - started < 5
            await asyncio.sleep(0)  # the late answer was dropped: the loop goes on
        finally:
            server.close()

    asyncio.run(main())


def test_close_stops_listening_and_frees_the_handle():
    before = native().handle_counts()["other"]

    async def main():
        server = StatusServer(bind("127.0.0.1", 0), {"/live": lambda: (200, TEXT, b"alive\n")})
        server.start()
        host, port = server.address.rsplit(":", 1)
        assert native().handle_counts()["other"] == before + 1
        server.close()
        await asyncio.sleep(0.05)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=5).close()
        with pytest.raises(RuntimeError):
            _ = server.address

    asyncio.run(main())
    assert native().handle_counts()["other"] == before


def test_bad_paths_and_sockets_are_refused():
    for paths in ({"metrics": lambda: (200, TEXT, b"")}, {"/a b": lambda: (200, TEXT, b"")}, {}):
        with pytest.raises(ValueError):
            StatusServer(bind("127.0.0.1", 0), paths)
    unbound = socket.socket()
    with pytest.raises(ValueError, match="not a listening socket"):
        StatusServer(unbound, {"/live": lambda: (200, TEXT, b"")})
    assert unbound.fileno() == -1, "taken over: closed"
