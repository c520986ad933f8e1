"""The worker's metrics listener (the library's status listener serving the worker's
routes) under silent connections: at most the cap are held, the oldest silent one makes
room for a new connection, so probes get through (in process)."""

from __future__ import annotations

import asyncio
import time

from dynamo_ctx.backends.metrics import WorkerMetrics
from dynamo_ctx.cli.worker import Readiness, status_routes
from dynamo_ctx.status import StatusServer, bind


async def _probe(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data


async def _closed(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), within) == b""
    except asyncio.TimeoutError:
        return False
    except ConnectionError:
        return True


def test_silent_connections_make_room_for_probes():
    cap, extra = 8, 20

    async def main():
        routes = status_routes(WorkerMetrics("m"), None, Readiness(None))
        server = StatusServer(bind("127.0.0.1", 0), routes, read_timeout=30.0, max_connections=cap)
        server.start()
        port = int(server.address.rsplit(":", 1)[1])
        silent = []
        try:
            for i in range(cap + extra):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                if i % 2:
                    writer.write(b"GET /live HTTP/1.1\r\n")  # never finished
                silent.append((reader, writer))
                await asyncio.sleep(0.005)  # accepted in order
            # Every probe gets its answer at once. The first takes the place of the oldest silent
            # connection; the next ones find the place the first left.
            for _ in range(5):
                start = time.monotonic()
                answer = await _probe(port)
                assert answer.startswith(b"HTTP/1.1 200"), answer
                assert time.monotonic() - start < 1.0
            closed = [await _closed(r, 0.05) for r, _ in silent]
            # The oldest are closed (the extra ones and one for the probes), the newest held.
            assert all(closed[: extra + 1]), [i for i, c in enumerate(closed) if not c]
            assert not any(closed[extra + 1 :]), [i for i, c in enumerate(closed) if c]
        finally:
            for _, w in silent:
                w.close()
            await asyncio.sleep(0.2)  # their handlers see the end
            server.close()

    asyncio.run(main())
