"""The C ABI's event queues (docs/c-abi.md): the fd that carries the tokens,
watches, drains, and freeing a queue or a context with watches pending."""

from __future__ import annotations

import os
import stat
from typing import List

import pytest

from c_abi import (
    DC_EBADF,
    DC_EEXIST,
    DC_EINVAL,
    DC_ENOENT,
    DC_KILLED,
    DC_LIVE,
    DC_REASON_PARENT,
    DC_STOPPED,
    counts,
    drain,
    expect,
    ffi,
    free_all,
    lib_fixture,  # noqa: F401 - the fixture "lib"
    new_child,
    new_ctx,
    new_queue,
    ok,
    readable,
    state,
)
from harness import HANG


# ---------------------------------------------------------------------------
# Event queues
# ---------------------------------------------------------------------------


def test_the_fd_carries_the_tokens(lib):
    """A reader may take the tokens from the fd itself (8 bytes each, native
    byte order) without calling the library, and must call dc_queue_drain
    after reading more than dc_queue_drain_after's bytes: a token that found
    the pipe full waits in the library, oldest after the pipe's."""
    import struct

    q, fd = new_queue(lib)
    after = ffi.new("size_t *")
    ok(lib, lib.dc_queue_drain_after(q, after))
    assert after[0] == 64 * 1024 - os.sysconf("SC_PAGE_SIZE")
    expect(lib, lib.dc_queue_drain_after(0, after), DC_EBADF, "dc_queue_drain_after")
    hs = [new_ctx(lib) for _ in range(8192 + 3)]  # a 64 KiB pipe's worth, and 3 more
    for i, h in enumerate(hs):
        ok(lib, lib.dc_context_watch(h, q, DC_KILLED, 1000 + i))
    for h in hs:
        ok(lib, lib.dc_context_kill(h))
    data = b""
    while readable(fd):
        data += os.read(fd, 4096)
    assert len(data) == 8192 * 8 > after[0]
    assert list(struct.unpack(f"={8192}Q", data)) == list(range(1000, 1000 + 8192))
    assert drain(lib, q) == [1000 + 8192, 1000 + 8193, 1000 + 8194]
    h = new_ctx(lib)
    ok(lib, lib.dc_context_watch(h, q, DC_KILLED, 7))
    ok(lib, lib.dc_context_kill(h))
    assert os.read(fd, 4096) == struct.pack("=Q", 7)  # the pipe carries the next ones again
    free_all(lib, h, *hs)
    ok(lib, lib.dc_queue_free(q))


def test_watch_fires_once_and_fd_follows_the_queue(lib):
    q, fd = new_queue(lib)
    h = new_ctx(lib)
    assert not readable(fd)
    ok(lib, lib.dc_context_watch(h, q, DC_STOPPED, 42))
    assert not readable(fd)
    assert drain(lib, q) == []
    ok(lib, lib.dc_context_stop_generating(h))
    # The token is queued before stop_generating returns.
    assert readable(fd)
    assert readable(fd, HANG)
    assert readable(fd)  # level-triggered: stays readable until drained
    assert drain(lib, q) == [42]
    assert not readable(fd)
    ok(lib, lib.dc_context_kill(h))  # fired already: nothing more
    assert not readable(fd)
    assert drain(lib, q) == []
    expect(lib, lib.dc_queue_unwatch(q, 42), DC_ENOENT, "dc_queue_unwatch")
    free_all(lib, h)
    ok(lib, lib.dc_queue_free(q))


@pytest.mark.parametrize(
    "watched, stop_first", [(DC_KILLED, True), (DC_STOPPED, False)], ids=["killed-ignores-stop", "stopped-fires-on-kill"]
)
def test_watch_fires_on_kill(lib, watched, stop_first):
    q, fd = new_queue(lib)
    h = new_ctx(lib)
    ok(lib, lib.dc_context_watch(h, q, watched, 7))
    if stop_first:  # a watch on DC_KILLED ignores a stop
        ok(lib, lib.dc_context_stop_generating(h))
        assert not readable(fd)
        assert drain(lib, q) == []
    ok(lib, lib.dc_context_kill(h))
    assert readable(fd, HANG)
    assert drain(lib, q) == [7]
    free_all(lib, h)
    ok(lib, lib.dc_queue_free(q))


def test_watch_fires_immediately_when_already_in_state(lib):
    q, fd = new_queue(lib)
    stopped, killed = new_ctx(lib), new_ctx(lib)
    ok(lib, lib.dc_context_stop_generating(stopped))
    ok(lib, lib.dc_context_kill(killed))
    ok(lib, lib.dc_context_watch(stopped, q, DC_STOPPED, 10))
    assert readable(fd)
    assert drain(lib, q) == [10]
    ok(lib, lib.dc_context_watch(killed, q, DC_STOPPED, 11))
    ok(lib, lib.dc_context_watch(killed, q, DC_KILLED, 12))
    assert drain(lib, q) == [11, 12]
    ok(lib, lib.dc_context_watch(stopped, q, DC_KILLED, 13))  # stopped is not killed
    assert not readable(fd)
    assert drain(lib, q) == []
    ok(lib, lib.dc_context_kill(stopped))
    assert drain(lib, q) == [13]
    assert not readable(fd)
    free_all(lib, stopped, killed)
    ok(lib, lib.dc_queue_free(q))


def test_watch_sees_propagation_from_parent(lib):
    q, fd = new_queue(lib)
    parent = new_ctx(lib)
    child = new_child(lib, parent)
    ok(lib, lib.dc_context_watch(child, q, DC_KILLED, 99))
    ok(lib, lib.dc_context_kill(parent))
    assert readable(fd, HANG)
    assert drain(lib, q) == [99]
    assert state(lib, child) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, parent, child)
    ok(lib, lib.dc_queue_free(q))


def test_watch_bad_state_and_duplicate_token(lib):
    q, _ = new_queue(lib)
    q2, fd2 = new_queue(lib)
    a, b = new_ctx(lib), new_ctx(lib)
    for bad in (DC_LIVE, 3, 2**32 - 1):
        expect(lib, lib.dc_context_watch(a, q, bad, 1), DC_EINVAL, "dc_context_watch")
    ok(lib, lib.dc_context_watch(a, q, DC_STOPPED, 5))
    expect(lib, lib.dc_context_watch(a, q, DC_STOPPED, 5), DC_EEXIST, "dc_context_watch")
    expect(lib, lib.dc_context_watch(b, q, DC_KILLED, 5), DC_EEXIST, "dc_context_watch")
    ok(lib, lib.dc_context_watch(b, q2, DC_KILLED, 5))  # tokens are per queue
    ok(lib, lib.dc_context_kill(a))
    assert drain(lib, q) == [5]
    ok(lib, lib.dc_context_watch(b, q, DC_KILLED, 5))  # fired, so free again
    ok(lib, lib.dc_context_kill(b))
    assert drain(lib, q) == [5]
    assert readable(fd2) and drain(lib, q2) == [5]
    free_all(lib, a, b)
    ok(lib, lib.dc_queue_free(q))
    ok(lib, lib.dc_queue_free(q2))


def test_unwatch(lib):
    q, fd = new_queue(lib)
    h = new_ctx(lib)
    expect(lib, lib.dc_queue_unwatch(q, 1), DC_ENOENT, "dc_queue_unwatch")  # never registered
    ok(lib, lib.dc_context_watch(h, q, DC_STOPPED, 1))
    ok(lib, lib.dc_context_watch(h, q, DC_STOPPED, 2))
    ok(lib, lib.dc_queue_unwatch(q, 1))
    expect(lib, lib.dc_queue_unwatch(q, 1), DC_ENOENT, "dc_queue_unwatch")
    ok(lib, lib.dc_context_kill(h))
    assert drain(lib, q) == [2]  # the unwatched token never arrives
    expect(lib, lib.dc_queue_unwatch(q, 2), DC_ENOENT, "dc_queue_unwatch")  # already fired
    # Fired but not yet drained: also DC_ENOENT, and the token stays queued.
    k = new_ctx(lib)
    ok(lib, lib.dc_context_watch(k, q, DC_KILLED, 3))
    ok(lib, lib.dc_context_kill(k))
    expect(lib, lib.dc_queue_unwatch(q, 3), DC_ENOENT, "dc_queue_unwatch")
    assert readable(fd) and drain(lib, q) == [3]
    # An unwatched token can be watched again, and then arrives exactly once.
    w = new_ctx(lib)
    ok(lib, lib.dc_context_watch(w, q, DC_STOPPED, 4))
    ok(lib, lib.dc_queue_unwatch(q, 4))
    ok(lib, lib.dc_context_watch(w, q, DC_STOPPED, 4))
    ok(lib, lib.dc_context_kill(w))
    assert drain(lib, q) == [4]
    free_all(lib, h, k, w)
    ok(lib, lib.dc_queue_free(q))


def test_tokens_are_fifo_and_any_64_bit_value(lib):
    q, fd = new_queue(lib)
    tokens = [2**64 - 1, 0, 1, 2**63, 0xDEADBEEFCAFEF00D]
    handles = [new_ctx(lib) for _ in tokens]
    for h, t in zip(handles, tokens):
        ok(lib, lib.dc_context_watch(h, q, DC_KILLED, t))
    for h in reversed(handles):
        ok(lib, lib.dc_context_kill(h))
    assert drain(lib, q) == list(reversed(tokens))
    free_all(lib, *handles)
    ok(lib, lib.dc_queue_free(q))


def test_drain_with_small_buffers(lib):
    q, fd = new_queue(lib)
    handles = [new_ctx(lib) for _ in range(5)]
    for i, h in enumerate(handles):
        ok(lib, lib.dc_context_watch(h, q, DC_STOPPED, 100 + i))
        ok(lib, lib.dc_context_kill(h))
    n = ffi.new("size_t *")
    ok(lib, lib.dc_queue_drain(q, ffi.NULL, 0, n))  # cap 0 takes nothing
    assert n[0] == 0 and readable(fd)
    assert drain(lib, q, 2) == [100, 101]
    assert readable(fd)
    assert drain(lib, q, 1) == [102]
    assert readable(fd)
    assert drain(lib, q, 2) == [103, 104]  # exactly cap and now empty
    assert not readable(fd)
    assert drain(lib, q, 2) == []
    # Many watches on one context fire in one cancel, in no particular order.
    one = new_ctx(lib)
    for t in range(20):
        ok(lib, lib.dc_context_watch(one, q, DC_KILLED, t))
    ok(lib, lib.dc_context_kill(one))
    got: List[int] = []
    while readable(fd):
        got += drain(lib, q, 3)
    assert sorted(got) == list(range(20))
    free_all(lib, one, *handles)
    ok(lib, lib.dc_queue_free(q))


def test_queue_free_with_pending_watches(lib):
    before = counts(lib)
    q, fd = new_queue(lib)
    a, b = new_ctx(lib), new_ctx(lib)
    child = new_child(lib, a)
    ok(lib, lib.dc_context_watch(a, q, DC_STOPPED, 1))
    ok(lib, lib.dc_context_watch(child, q, DC_KILLED, 2))
    ok(lib, lib.dc_context_watch(b, q, DC_KILLED, 3))
    ok(lib, lib.dc_context_kill(b))  # one token queued and never drained
    ok(lib, lib.dc_queue_free(q))
    # Cancelling the watched contexts afterwards is harmless.
    ok(lib, lib.dc_context_kill(a))
    assert state(lib, child) == (DC_KILLED, DC_REASON_PARENT)
    expect(lib, lib.dc_queue_free(q), DC_EBADF, "dc_queue_free")
    expect(lib, lib.dc_context_watch(a, q, DC_KILLED, 4), DC_EBADF, "dc_context_watch")
    expect(lib, lib.dc_queue_unwatch(q, 1), DC_EBADF, "dc_queue_unwatch")
    expect(lib, lib.dc_queue_drain(q, ffi.new("uint64_t[1]"), 1, ffi.new("size_t *")), DC_EBADF, "dc_queue_drain")
    free_all(lib, a, b, child)
    assert counts(lib) == before


def test_context_free_with_pending_watch(lib):
    q, fd = new_queue(lib)
    parent = new_ctx(lib)
    child = new_child(lib, parent)
    ok(lib, lib.dc_context_watch(child, q, DC_KILLED, 8))
    free_all(lib, child)  # the watch outlives the handle
    ok(lib, lib.dc_context_kill(parent))
    assert readable(fd) and drain(lib, q) == [8]
    free_all(lib, parent)
    ok(lib, lib.dc_queue_free(q))


def test_queue_fds_are_pipes_closed_by_free(lib):
    queues = [new_queue(lib) for _ in range(20)]
    pipes = {}
    for _, fd in queues:
        st = os.fstat(fd)
        assert stat.S_ISFIFO(st.st_mode)
        pipes[fd] = (st.st_dev, st.st_ino)
    assert len(pipes) == 20
    for q, _ in queues:
        ok(lib, lib.dc_queue_free(q))
    # Each fd is closed: the number is either unused or reused for something
    # else (the process may open files meanwhile), never still our pipe.
    for fd, ident in pipes.items():
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        assert (st.st_dev, st.st_ino) != ident, f"fd {fd} still open after dc_queue_free"
