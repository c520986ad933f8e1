"""The C ABI's handles (docs/c-abi.md): zero, freed, forged and wrong-kind
handles are errors; handle accounting; contexts used from many threads."""

from __future__ import annotations

import random
import threading
from typing import List, Optional

import pytest

from c_abi import (
    DC_EBADF,
    DC_EINVAL,
    DC_KILLED,
    DC_LIVE,
    DC_OK,
    DC_REASON_KILL,
    DC_REASON_NONE,
    DC_REASON_PARENT,
    DC_REASON_SHUTDOWN,
    counts,
    drain,
    expect,
    ffi,
    free_all,
    last_error,
    lib_fixture,  # noqa: F401 - the fixture "lib"
    new_ctx,
    new_queue,
    ok,
    state,
)
from harness import HANG


# ---------------------------------------------------------------------------
# Bad handles
# ---------------------------------------------------------------------------


def context_calls(lib, h: int):
    """Every function taking a context handle, called with h."""
    n = ffi.new("size_t *")
    return [
        ("dc_context_id", lambda: lib.dc_context_id(h, ffi.new("char[64]"), 64, n)),
        ("dc_context_state", lambda: lib.dc_context_state(h, ffi.new("uint32_t *"))),
        ("dc_context_state_word", lambda: lib.dc_context_state_word(h, ffi.new("uint32_t **"))),
        ("dc_context_cancel", lambda: lib.dc_context_cancel(h, DC_KILLED, DC_REASON_SHUTDOWN)),
        ("dc_context_cancel_held", lambda: lib.dc_context_cancel_held(h, DC_KILLED, DC_REASON_SHUTDOWN, ffi.new("uint64_t *"))),
        # A good queue, so that the context's handle is what it refuses.
        ("dc_context_cancel_local", lambda: _cancel_local(lib, h)),
        ("dc_context_stop_generating", lambda: lib.dc_context_stop_generating(h)),
        ("dc_context_kill", lambda: lib.dc_context_kill(h)),
        ("dc_context_child", lambda: lib.dc_context_child(h, ffi.new("uint64_t *"))),
        ("dc_context_finish", lambda: lib.dc_context_finish(h)),
        ("dc_context_free", lambda: lib.dc_context_free(h)),
    ]


def _cancel_local(lib, h: Optional[int], q: Optional[int] = None) -> int:
    """dc_context_cancel_local of h on q. None for h: a live context of its
    own (a queue's bad handle must be what the call refuses); for q: a new
    queue of its own. Its own are freed after."""
    own_h, own_q = h is None, q is None
    h = new_ctx(lib) if own_h else h
    q = new_queue(lib)[0] if own_q else q
    try:
        return lib.dc_context_cancel_local(h, DC_KILLED, DC_REASON_SHUTDOWN, q, ffi.new("uint64_t[4]"), 4, ffi.new("size_t *"),
                                           ffi.new("uint64_t *"))
    finally:
        if own_h:
            free_all(lib, h)
        if own_q:
            ok(lib, lib.dc_queue_free(q))


def queue_calls(lib, q: int):
    """Every function taking a queue handle, called with q."""
    return [
        ("dc_queue_drain", lambda: lib.dc_queue_drain(q, ffi.new("uint64_t[4]"), 4, ffi.new("size_t *"))),
        ("dc_queue_unwatch", lambda: lib.dc_queue_unwatch(q, 1)),
        ("dc_queue_push", lambda: lib.dc_queue_push(q, ffi.new("uint64_t[1]", [1]), 1)),
        ("dc_context_cancel_local", lambda: _cancel_local(lib, None, q)),
        ("dc_queue_free", lambda: lib.dc_queue_free(q)),
    ]


def test_zero_freed_and_double_freed_handles(lib):
    live = new_ctx(lib)
    live_q, _ = new_queue(lib)
    freed = new_ctx(lib)
    free_all(lib, freed)
    freed_q, _ = new_queue(lib)
    ok(lib, lib.dc_queue_free(freed_q))
    for bad in (0, freed):
        for name, call in context_calls(lib, bad):
            expect(lib, call(), DC_EBADF, name)
        expect(lib, lib.dc_context_link_child(bad, live), DC_EBADF, "dc_context_link_child (parent)")
        expect(lib, lib.dc_context_link_child(live, bad), DC_EBADF, "dc_context_link_child (child)")
        expect(lib, lib.dc_context_watch(bad, live_q, DC_KILLED, 1), DC_EBADF, "dc_context_watch")
    for bad in (0, freed_q):
        for name, call in queue_calls(lib, bad):
            expect(lib, call(), DC_EBADF, name)
        expect(lib, lib.dc_context_watch(live, bad, DC_KILLED, 1), DC_EBADF, "dc_context_watch")
    assert state(lib, live) == (DC_LIVE, DC_REASON_NONE)  # none of that touched the live one
    free_all(lib, live)
    expect(lib, lib.dc_context_free(live), DC_EBADF, "dc_context_free")  # double free
    ok(lib, lib.dc_queue_free(live_q))
    expect(lib, lib.dc_queue_free(live_q), DC_EBADF, "dc_queue_free")


def test_wrong_kind_handles(lib):
    h = new_ctx(lib)
    q, _ = new_queue(lib)
    for name, call in context_calls(lib, q):  # a queue handle where a context is expected
        expect(lib, call(), DC_EBADF, name)
    for name, call in queue_calls(lib, h):  # and the other way round
        expect(lib, call(), DC_EBADF, name)
    expect(lib, lib.dc_context_link_child(q, h), DC_EBADF, "dc_context_link_child")
    expect(lib, lib.dc_context_watch(q, h, DC_KILLED, 1), DC_EBADF, "dc_context_watch")
    # Both still work.
    assert state(lib, h) == (DC_LIVE, DC_REASON_NONE)
    assert drain(lib, q) == []
    free_all(lib, h)
    ok(lib, lib.dc_queue_free(q))


def test_forged_generations_are_rejected(lib):
    h = new_ctx(lib)
    q, _ = new_queue(lib)
    # Any other value in the bits above the slot index of a live handle names
    # no live handle of the same slot.
    for bit in range(32, 56):
        for name, call in context_calls(lib, h ^ (1 << bit)):
            expect(lib, call(), DC_EBADF, name)
        for name, call in queue_calls(lib, q ^ (1 << bit)):
            expect(lib, call(), DC_EBADF, name)
    assert state(lib, h) == (DC_LIVE, DC_REASON_NONE)
    free_all(lib, h)
    ok(lib, lib.dc_queue_free(q))


@pytest.mark.parametrize("function", ["dc_context_kill", "dc_context_stop_generating"])
def test_shorthand_errors_name_the_function(lib, function):
    assert getattr(lib, function)(0) == DC_EBADF
    assert function in last_error(lib), last_error(lib)


def test_random_handles(lib):
    rng = random.Random(20240607)
    before = counts(lib)
    word = ffi.new("uint32_t *")
    n = ffi.new("size_t *")
    hits = 0
    for _ in range(3000):
        h = rng.getrandbits(64)
        if lib.dc_context_state(h, word) == DC_OK:
            hits += 1  # a live handle of someone else's: astronomically unlikely; leave it be
        else:
            assert lib.dc_context_state(h, word) == DC_EBADF
            assert lib.dc_context_kill(h) == DC_EBADF
            assert lib.dc_context_free(h) == DC_EBADF
        if lib.dc_queue_drain(h, ffi.NULL, 0, n) == DC_OK:
            hits += 1
        else:
            assert lib.dc_queue_drain(h, ffi.NULL, 0, n) == DC_EBADF
            assert lib.dc_queue_unwatch(h, 1) == DC_EBADF
            assert lib.dc_queue_free(h) == DC_EBADF
    assert hits == 0
    assert "bad handle" in last_error(lib)
    assert counts(lib) == before


# ---------------------------------------------------------------------------
# Handle accounting and threads
# ---------------------------------------------------------------------------


def test_handle_counts_track_creates_and_frees(lib):
    c0, q0, o0 = counts(lib)
    hs = [new_ctx(lib) for _ in range(10)]
    qs = [new_queue(lib)[0] for _ in range(3)]
    assert counts(lib) == (c0 + 10, q0 + 3, o0)
    free_all(lib, *hs)
    for q in qs:
        ok(lib, lib.dc_queue_free(q))
    assert counts(lib) == (c0, q0, o0)
    only = ffi.new("uint64_t *")
    ok(lib, lib.dc_handle_counts(only, ffi.NULL, ffi.NULL))
    assert only[0] == c0


def test_many_create_free_cycles_leave_counts_unchanged(lib):
    before = counts(lib)
    out = ffi.new("uint64_t *")
    new_uuid, new_named, free = lib.dc_context_new_uuid, lib.dc_context_new, lib.dc_context_free
    for i in range(100_000):
        rc = new_uuid(out) if i & 1 else new_named(b"req", 3, out)
        assert rc == DC_OK
        assert free(out[0]) == DC_OK
    assert counts(lib) == before
    q = ffi.new("uint64_t *")
    fd = ffi.new("int *")
    h = new_ctx(lib)
    for i in range(2000):
        assert lib.dc_queue_new(q, fd) == DC_OK
        assert lib.dc_context_watch(h, q[0], DC_KILLED, i) == DC_OK
        assert lib.dc_queue_free(q[0]) == DC_OK
    free_all(lib, h)
    assert counts(lib) == before


def test_threads_create_link_kill_free(lib):
    before = counts(lib)
    errors: List[str] = []

    def worker(k: int) -> None:
        try:
            out = ffi.new("uint64_t *")
            word = ffi.new("uint32_t *")
            bad_len = 5000 + k  # a thread-specific failure, to check messages stay per thread
            for i in range(5000):
                assert lib.dc_context_new_uuid(out) == DC_OK
                parent = out[0]
                assert lib.dc_context_new(b"linked", 6, out) == DC_OK
                linked = out[0]
                assert lib.dc_context_link_child(parent, linked) == DC_OK
                assert lib.dc_context_child(parent, out) == DC_OK
                child = out[0]
                if i % 2:
                    assert lib.dc_context_kill(parent) == DC_OK
                else:
                    assert lib.dc_context_kill(linked) == DC_OK
                    assert lib.dc_context_kill(parent) == DC_OK
                assert lib.dc_context_state(child, word) == DC_OK
                # Propagated: reason parent, cause the kill at the origin.
                assert word[0] == DC_KILLED | DC_REASON_PARENT << 8 | DC_REASON_KILL << 16
                assert lib.dc_context_state(linked, word) == DC_OK
                assert word[0] & 0xFF == DC_KILLED
                for h in (parent, linked, child):
                    assert lib.dc_context_free(h) == DC_OK
                if i % 500 == 0:
                    assert lib.dc_context_new(b"x" * bad_len, bad_len, out) == DC_EINVAL
                    assert f"it is {bad_len} bytes long" in last_error(lib), last_error(lib)
        except BaseException as exc:  # report, do not hang the join
            errors.append(f"thread {k}: {exc!r}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert errors == []
    assert counts(lib) == before


def test_kill_races_with_linking(lib):
    parent = new_ctx(lib)
    linked_some = threading.Event()
    children: List[int] = []

    def linker() -> None:
        out = ffi.new("uint64_t *")
        for i in range(3000):
            assert lib.dc_context_new_uuid(out) == DC_OK
            assert lib.dc_context_link_child(parent, out[0]) == DC_OK
            children.append(out[0])
            if i == 100:
                linked_some.set()

    t = threading.Thread(target=linker)
    t.start()
    assert linked_some.wait(HANG)
    ok(lib, lib.dc_context_kill(parent))
    t.join(HANG)
    assert not t.is_alive() and len(children) == 3000
    # Each child was linked either before the kill (and propagated to) or after (and killed at once).
    assert all(state(lib, c) == (DC_KILLED, DC_REASON_PARENT) for c in children)
    free_all(lib, parent, *children)
