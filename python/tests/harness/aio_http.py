"""HTTP/1.1 on asyncio streams, for benchmarks and tests with hundreds of clients on
one event loop: a request on a connection of its own (``request_async``), requests
one after another on a kept-alive connection (``send_request`` then
``read_response``), and a streamed completion held open once its first event has
come (``open_stream_async``).

(``stream_completion`` in sse.py reads a whole streamed completion into a Result.)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List, Optional, Tuple

from .http_client import request_bytes

Response = Tuple[int, Dict[str, str], bytes]  # status, headers (names in lower case), body


def send_request(writer: asyncio.StreamWriter, method: str, path: str, body: Optional[Any] = None,
                 headers: Optional[Dict[str, str]] = None, close: bool = False) -> None:
    """Write one request on ``writer`` (``body`` JSON unless bytes; ``close``:
    ``Connection: close``)."""
    writer.write(request_bytes(method, path, body, headers, close))


async def read_response(reader: asyncio.StreamReader) -> Response:
    """The next response on ``reader``: its body by Content-Length, chunked, or up to
    the end of the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = await reader.read()
    return status, headers, body


async def request_async(host: str, port: int, method: str, path: str, body: Optional[Any] = None,
                        headers: Optional[Dict[str, str]] = None) -> Response:
    """One request on a connection of its own (``Connection: close``), its response read whole."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        send_request(writer, method, path, body, headers, close=True)
        return await read_response(reader)
    finally:
        writer.close()


async def open_stream_async(host: str, port: int, body: Any, headers: Optional[Dict[str, str]] = None,
                            limit: int = 1 << 16) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """POST a streamed completion (``body`` as given: JSON unless bytes) to
    /v1/completions and return the connection once its first event has come: the
    request is in flight. Closing the writer is a client that goes away."""
    reader, writer = await asyncio.open_connection(host, port, limit=limit)
    send_request(writer, "POST", "/v1/completions", body, headers)
    await writer.drain()
    while True:  # the head, then the first event
        line = await reader.readline()
        if not line:
            writer.close()
            raise ConnectionError("closed before the first event")
        if line.startswith(b"data: "):
            return reader, writer


def sse_data(body: bytes) -> List[str]:
    """The data of each event of a streamed response's body (``[DONE]`` too)."""
    return [ln[len("data: "):].strip() for ln in body.decode("utf-8", "replace").split("\n") if ln.startswith("data: ")]


def error_code(body: bytes) -> str:
    """The ``error.code`` of an OpenAI error body ("?" when it has none)."""
    try:
        return str(json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "?"
