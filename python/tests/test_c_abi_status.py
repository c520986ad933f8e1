"""The C ABI's status listener (docs/c-abi.md): a C host serves its status
endpoints on its own listening socket, woken through an event queue's fd,
taking each request with dc_status_next and answering it with
dc_status_answer; bad arguments, handles and answers are errors."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from typing import List, Tuple

from c_abi import (
    DC_EAGAIN,
    DC_EBADF,
    DC_EINVAL,
    DC_ENOENT,
    DC_STATUS_PATH_MAX,
    counts,
    drain,
    expect,
    ffi,
    lib_fixture,  # noqa: F401 - the fixture "lib"
    new_queue,
    ok,
    readable,
)
from harness import HANG

PATHS = b"/metrics\n/health"


def listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


def start(lib, sock: socket.socket, **bounds) -> int:
    out = ffi.new("uint64_t *")
    ok(lib, lib.dc_status_start(sock.fileno(), PATHS, len(PATHS), bounds.get("read_timeout", 0.0),
                                bounds.get("max_connections", 0), bounds.get("answer_timeout", 0.0), out))
    assert out[0] != 0
    return out[0]


def addr(lib, h: int) -> str:
    buf, n = ffi.new("char[64]"), ffi.new("size_t *")
    ok(lib, lib.dc_status_addr(h, buf, 64, n))
    return ffi.unpack(buf, n[0]).decode()


def next_request(lib, h: int) -> Tuple[int, int, str]:
    rid, path, n = ffi.new("uint64_t *"), ffi.new("char[]", DC_STATUS_PATH_MAX), ffi.new("size_t *")
    rc = lib.dc_status_next(h, rid, path, DC_STATUS_PATH_MAX, n)
    return rc, rid[0], ffi.unpack(path, n[0]).decode() if rc == 0 else ""


def fetch_in_thread(url: str, out: List) -> threading.Thread:
    def run() -> None:
        try:
            with urllib.request.urlopen(url, timeout=HANG) as r:
                out.append((r.status, r.headers["Content-Type"], r.read()))
        except urllib.error.HTTPError as e:
            out.append((e.code, e.headers["Content-Type"], e.read()))

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_c_host_answers_through_its_event_queue(lib):
    before = counts(lib)
    with listening() as sock:
        h = start(lib, sock)
    # The host's own socket is closed: the library serves its copy.
    q, fd = new_queue(lib)
    assert next_request(lib, h)[0] == DC_EAGAIN
    ok(lib, lib.dc_arm(h, q, 7))
    got: List = []
    t = fetch_in_thread(f"http://{addr(lib, h)}/metrics?name=x", got)
    assert readable(fd, HANG), "the request woke the host"
    assert drain(lib, q) == [7]
    rc, rid, path = next_request(lib, h)
    assert (rc, path) == (0, "/metrics")
    body = b"dynamo_ctx_up 1\n"
    ok(lib, lib.dc_status_answer(h, rid, 200, b"text/plain", 10, body, len(body)))
    t.join(HANG)
    assert got == [(200, "text/plain", body)]
    expect(lib, lib.dc_status_answer(h, rid, 200, ffi.NULL, 0, ffi.NULL, 0), DC_ENOENT, "dc_status_answer")
    ok(lib, lib.dc_arm(h, q, 8))
    ok(lib, lib.dc_status_free(h))
    assert readable(fd, HANG) and drain(lib, q) == [8], "freeing wakes an armed host"
    expect(lib, lib.dc_status_free(h), DC_EBADF, "dc_status_free")
    ok(lib, lib.dc_queue_free(q))
    assert counts(lib) == before


def test_a_request_the_host_does_not_answer_in_time_is_503(lib):
    with listening() as sock:
        h = start(lib, sock, answer_timeout=0.1)
    got: List = []
    fetch_in_thread(f"http://{addr(lib, h)}/health", got).join(HANG)
    assert got and got[0][0] == 503 and b"no answer within" in got[0][2]
    assert next_request(lib, h)[0] == DC_EAGAIN, "it no longer waits"
    ok(lib, lib.dc_status_free(h))


def test_bad_arguments(lib):
    out = ffi.new("uint64_t *")
    with listening() as sock:
        fd = sock.fileno()
        expect(lib, lib.dc_status_start(fd, PATHS, len(PATHS), 0.0, 0, 0.0, ffi.NULL), DC_EINVAL, "dc_status_start")
        expect(lib, lib.dc_status_start(fd, ffi.NULL, 0, 0.0, 0, 0.0, out), DC_EINVAL, "dc_status_start")
        expect(lib, lib.dc_status_start(fd, b"metrics", 7, 0.0, 0, 0.0, out), DC_EINVAL, "dc_status_start")
        expect(lib, lib.dc_status_start(fd, PATHS, len(PATHS), -1.0, 0, 0.0, out), DC_EINVAL, "dc_status_start")
        expect(lib, lib.dc_status_start(fd, PATHS, len(PATHS), 0.0, -1, 0.0, out), DC_EINVAL, "dc_status_start")
        expect(lib, lib.dc_status_start(fd, PATHS, len(PATHS), 0.0, 0, float("inf"), out), DC_EINVAL, "dc_status_start")
        h = start(lib, sock)
    with socket.socket() as unbound:
        msg = expect(lib, lib.dc_status_start(unbound.fileno(), PATHS, len(PATHS), 0.0, 0, 0.0, out), DC_EINVAL, "dc_status_start")
        assert "not a listening socket" in msg
    rid, path, n = ffi.new("uint64_t *"), ffi.new("char[8]"), ffi.new("size_t *")
    expect(lib, lib.dc_status_next(h, rid, path, 8, n), DC_EINVAL, "dc_status_next")
    expect(lib, lib.dc_status_next(h, ffi.NULL, path, 8, n), DC_EINVAL, "dc_status_next")
    for code, ctype in ((99, b"text/plain"), (600, b"text/plain"), (200, b"text/plain\r\nX-Injected: 1")):
        expect(lib, lib.dc_status_answer(h, 1, code, ctype, len(ctype), ffi.NULL, 0), DC_EINVAL, "dc_status_answer")
    expect(lib, lib.dc_status_answer(h, 1, 200, ffi.NULL, 3, ffi.NULL, 0), DC_EINVAL, "dc_status_answer")
    ok(lib, lib.dc_status_free(h))
    for bad in (0, h):
        expect(lib, lib.dc_status_addr(bad, ffi.NULL, 0, ffi.new("size_t *")), DC_EBADF, "dc_status_addr")
        expect(lib, lib.dc_status_next(bad, rid, ffi.new("char[]", DC_STATUS_PATH_MAX), DC_STATUS_PATH_MAX, n), DC_EBADF, "dc_status_next")
        expect(lib, lib.dc_status_answer(bad, 1, 200, ffi.NULL, 0, ffi.NULL, 0), DC_EBADF, "dc_status_answer")
        expect(lib, lib.dc_arm(bad, 1, 1), DC_EBADF, "dc_arm")
