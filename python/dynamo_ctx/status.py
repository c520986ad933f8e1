"""Status endpoints over HTTP (a worker's ``/metrics`` and ``/health``), served
by the library's listener.

The listener is Go's (go/status, on go/listener: the frontend's connection
policy). It parses each request and queues a GET or HEAD of one of the
routes' paths for this process; the event loop learns of it through its
readiness fd (``_aio.arm``), renders the answer with the route's function and
hands it back. Go never calls Python, and no call here blocks the loop. A
route that does not answer within ``answer_timeout`` (the loop is stuck) is
answered 503 by the listener; the bounds are in ``StatusServer``'s doc.

The port is bound here (``bind``), the library serves it: a process may bind
it first and load the library later (a worker loads its engine, which may
fork, before the library); clients wait in the listen queue meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Callable, Mapping, Optional, Tuple

from ._aio import arm
from ._lib import native

logger = logging.getLogger("dynamo_ctx.status")

__all__ = ["StatusServer", "Answer", "TEXT", "bind"]

#: An answer: the HTTP status code, the content type and the body.
Answer = Tuple[int, str, bytes]

#: The content type of a plain-text answer.
TEXT = "text/plain; charset=utf-8"

#: The listen queue of a bound port (asyncio's default).
BACKLOG = 100


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (port 0: a free one), the
    first address ``host`` resolves to; ``OSError`` when it cannot."""
    family, kind, proto, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


class StatusServer:
    """Serves ``routes`` (path -> a function rendering its answer) on
    ``sock``, a listening socket (``bind``'s), which it takes over (closes);
    ``start()`` (on the running loop) makes the loop answer them, ``close()``
    stops.

    The listener's bounds (0: its defaults, ``dynamo_ctx.h``'s
    ``dc_status_start``): a client has ``read_timeout`` seconds (10) to
    send its request's line and headers (at most 16 KiB); at most
    ``max_connections`` (64) connections are held before their request's
    headers arrived, one more closing the oldest of them, and at most as
    many requests wait for their answer, one more getting 503 at once; a
    route has ``answer_timeout`` seconds (2) to answer, else its client gets
    503. Another method is 405, another path 404; a query string is ignored;
    each connection is closed after its answer. A route that raises is
    answered 500 (and logged). ``ValueError`` for a bad path or bound.
    """

    def __init__(
        self,
        sock: socket.socket,
        routes: Mapping[str, Callable[[], Answer]],
        *,
        read_timeout: float = 0,
        max_connections: int = 0,
        answer_timeout: float = 0,
    ) -> None:
        self._lib = native()
        self._routes = dict(routes)
        self._task: "Optional[asyncio.Future[None]]" = None
        with sock:  # the library serves its own copy
            self._h: Optional[int] = self._lib.status_start(
                sock.fileno(), "\n".join(self._routes), float(read_timeout), int(max_connections), float(answer_timeout)
            )

    @property
    def address(self) -> str:
        """``host:port`` the listener listens on."""
        if self._h is None:
            raise RuntimeError("the status server is closed")
        return str(self._lib.status_addr(self._h))

    def start(self) -> None:
        """Answer the requests from now on, on the running loop."""
        if self._h is not None and self._task is None:
            self._task = asyncio.ensure_future(self._serve(self._h))

    async def _serve(self, h: int) -> None:
        lib = self._lib
        while True:
            code, request, path = lib.status_next(h)
            if code == lib.OK and path is not None:
                self._answer(h, request, path)
            elif code == lib.ECLOSED:
                return
            else:
                await arm(h)

    def _answer(self, h: int, request: int, path: str) -> None:
        """Render the route's answer and hand it back (a request that no
        longer waits is dropped by the library)."""
        try:
            status, ctype, body = self._routes[path]()
            self._lib.status_answer(h, request, status, ctype, bytes(body))
        except Exception:  # noqa: BLE001 - a route's bug (or an answer the library refuses) is its client's 500, not the loop's end
            logger.exception("the answer to %s failed", path)
            self._lib.status_answer(h, request, 500, TEXT, b"internal error\n")

    def close(self) -> None:
        """Stop at once: the listener and its connections close. Idempotent."""
        h, self._h = self._h, None
        if self._task is not None:
            self._task.cancel()
        if h is not None:
            self._lib.status_free(h)
