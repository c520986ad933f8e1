"""HTTP for tests and benchmarks: requests with urllib, raw sockets, Prometheus text.

(SSE streams of completions are in sse.py; HTTP on asyncio streams in aio_http.py.)
"""

from __future__ import annotations

import collections
import json
import socket
import urllib.error
import urllib.request
from typing import Any, DefaultDict, Dict, Optional, Tuple

from .procs import HANG

Response = Tuple[int, Dict[str, str], bytes]  # status, headers, body


def http_request(method: str, url: str, body: Optional[Any] = None, headers: Optional[Dict[str, str]] = None,
                 timeout: float = 10.0) -> Response:
    """One request; ``body`` is sent as JSON unless it is bytes. An error status is
    returned like any other (its body too), not raised."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = dict(headers or {})
    if data is not None and not isinstance(body, bytes):
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def http_get(url: str, timeout: float = 10.0, method: str = "GET") -> Response:
    return http_request(method, url, timeout=timeout)


def http_json(method: str, url: str, body: Optional[Any] = None, headers: Optional[Dict[str, str]] = None,
              timeout: float = 120.0) -> Any:
    """The JSON a request answers; an error status fails."""
    status, _, raw = http_request(method, url, body, headers, timeout)
    if status >= 400:
        raise AssertionError(f"{method} {url}: HTTP {status}: {raw[:500]!r}")
    return json.loads(raw)


def parse_prometheus(text: str) -> Dict[str, float]:
    """``{'name{labels}': value}`` for each sample line, the series key exactly as written."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def metric_sums(text: str) -> DefaultDict[str, float]:
    """Each metric by bare name (labels dropped), summed over its label sets; a metric
    with no series yet (a counter of no abort so far) reads 0."""
    out: DefaultDict[str, float] = collections.defaultdict(float)
    for key, value in parse_prometheus(text).items():
        out[key.split("{")[0]] += value
    return out


def scrape(port: int, host: str = "127.0.0.1") -> DefaultDict[str, float]:
    """``metric_sums`` of http://host:port/metrics."""
    return metric_sums(http_get(f"http://{host}:{port}/metrics")[2].decode())


def request_bytes(method: str, path: str, body: Optional[Any] = None, headers: Optional[Dict[str, str]] = None,
                  close: bool = False, host: str = "x") -> bytes:
    """An HTTP/1.1 request as sent on a raw connection: ``body`` JSON unless bytes
    (none: no body), ``close``: ``Connection: close``."""
    payload = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    if close:
        head += "Connection: close\r\n"
    return (head + "\r\n").encode() + payload


def send_post(host: str, port: int, path: str, body: Any, headers: Optional[Dict[str, str]] = None,
              close: bool = True, timeout: Optional[float] = HANG) -> socket.socket:
    """POST ``body`` (JSON unless bytes) over a raw HTTP/1.1 connection and return the
    socket, the response unread: the caller reads it (``read_all``), or closes the
    socket to play a client that goes away. ``close``: send ``Connection: close``."""
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall(request_bytes("POST", path, body, headers, close, host=f"{host}:{port}"))
    return s


def read_all(s: socket.socket) -> bytes:
    """Everything the server sends on ``s`` until it closes; closes ``s``."""
    data = b""
    with s:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk


def split_response(data: bytes) -> Tuple[int, str, bytes]:
    """A raw response's status, head (text) and body (bytes, as sent)."""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head.decode("latin-1"), body
