"""The C ABI's contexts (docs/c-abi.md): creation and ids, the state word,
cancellation, children, deadlines."""

from __future__ import annotations

import re
import uuid

import pytest

from c_abi import (
    ALL_REASONS,
    DC_EINVAL,
    DC_ENOENT,
    DC_ERANGE,
    DC_KILLED,
    DC_LIVE,
    DC_REASON_CLIENT_DISCONNECTED,
    DC_REASON_DEADLINE,
    DC_REASON_KILL,
    DC_REASON_NONE,
    DC_REASON_PARENT,
    DC_REASON_SHUTDOWN,
    DC_REASON_STOP_GENERATING,
    DC_STOPPED,
    REASON_NAMES,
    counts,
    ctx_id,
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
# Contexts: creation and ids
# ---------------------------------------------------------------------------


def test_create_with_id_and_uuid(lib):
    h = new_ctx(lib, "req-42")
    assert ctx_id(lib, h) == "req-42"
    assert state(lib, h) == (DC_LIVE, DC_REASON_NONE)
    u1, u2 = new_ctx(lib), new_ctx(lib)
    s1, s2 = ctx_id(lib, u1), ctx_id(lib, u2)
    for s in (s1, s2):
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", s), s
        assert uuid.UUID(s).version == 4
    assert s1 != s2
    assert len({h, u1, u2}) == 3
    free_all(lib, h, u1, u2)


@pytest.mark.parametrize(
    "id",
    ["a", "req-42", "réq-ñ-日本語-🙂", "x" * 256, "é" * 128, "🙂" * 64, " space and ~ "],
    ids=["one-byte", "ascii", "non-ascii", "256-ascii", "256-2byte", "256-4byte", "spaces"],
)
def test_id_round_trip(lib, id):
    h = new_ctx(lib, id)
    assert ctx_id(lib, h) == id
    free_all(lib, h)


def test_id_is_length_delimited_not_nul_terminated(lib):
    out = ffi.new("uint64_t *")
    raw = ffi.new("char[]", b"abcdef")  # only the first 3 bytes are the id
    ok(lib, lib.dc_context_new(raw, 3, out))
    assert ctx_id(lib, out[0]) == "abc"
    free_all(lib, out[0])


def test_context_id_buffer_too_small(lib):
    id = "req-ünïcode-77"
    raw = id.encode()
    h = new_ctx(lib, id)
    n = ffi.new("size_t *")
    for cap in (0, 1, len(raw) // 2, len(raw)):  # len(raw) leaves no room for the NUL
        n[0] = 12345
        buf = ffi.new("char[]", max(cap, 1))
        expect(lib, lib.dc_context_id(h, buf if cap else ffi.NULL, cap, n), DC_ERANGE, "dc_context_id")
        assert n[0] == len(raw)
    buf = ffi.new("char[]", b"\xaa" * (len(raw) + 4))
    ok(lib, lib.dc_context_id(h, buf, n[0] + 1, n))
    assert n[0] == len(raw)
    assert ffi.unpack(buf, len(raw) + 2) == raw + b"\0\xaa"  # NUL-terminated, nothing past it
    free_all(lib, h)


def test_length_pointer_may_be_null_for_string_getters(lib):
    h = new_ctx(lib, "req-9")
    buf = ffi.new("char[16]")
    ok(lib, lib.dc_context_id(h, buf, 16, ffi.NULL))
    assert ffi.string(buf) == b"req-9"
    expect(lib, lib.dc_context_id(h, buf, 3, ffi.NULL), DC_ERANGE, "dc_context_id")
    ok(lib, lib.dc_reason_name(DC_REASON_KILL, buf, 16, ffi.NULL))
    assert ffi.string(buf) == b"kill"
    free_all(lib, h)


@pytest.mark.parametrize(
    "raw,length",
    [
        (None, 3),
        (b"", 0),
        (b"abc", 0),
        (b"x" * 257, 257),
        ("é".encode() * 129, 258),
        (b"\xff\xfe", 2),
        (b"\xed\xa0\x80", 3),  # a UTF-16 surrogate, not valid UTF-8
        (b"\xc0\xaf", 2),  # overlong encoding
        ("日".encode()[:2], 2),  # truncated sequence
        (b"ab\0cd", 5),
        (b"\0", 1),
        (b"tab\tand", 7),
        (b"\x01", 1),
        (b"\x7f", 1),
        ("a\u200bb".encode(), 5),  # a format character
        ("a\u2028b".encode(), 5),  # a line separator
    ],
    ids=["null", "empty", "zero-len", "257", "258-2byte", "ff-fe", "surrogate", "overlong", "truncated", "nul", "only-nul",
         "tab", "control", "del", "zero-width-space", "line-separator"],
)
def test_bad_ids(lib, raw, length):
    """The id rule (DC_MAX_ID_LEN): dc_context_new and dc_id_check refuse the
    same ids, with a message stating the rule."""
    before = counts(lib)
    out = ffi.new("uint64_t *", 0)
    arg = ffi.NULL if raw is None else ffi.new("char[]", raw)
    msg = expect(lib, lib.dc_context_new(arg, length, out), DC_EINVAL, "dc_context_new")
    assert out[0] == 0  # nothing stored on failure
    assert counts(lib) == before
    if raw is not None:
        assert "1 to 256 bytes of printable UTF-8" in msg, msg
        assert "1 to 256 bytes of printable UTF-8" in expect(lib, lib.dc_id_check(arg, length), DC_EINVAL, "dc_id_check")


@pytest.mark.parametrize("id", ["a", "x" * 256, "é" * 128, " ~ réq 🙂"], ids=["one-byte", "256-ascii", "256-2byte", "mixed"])
def test_id_check_accepts_what_context_new_accepts(lib, id):
    raw = id.encode()
    assert lib.DC_MAX_ID_LEN == 256
    ok(lib, lib.dc_id_check(raw, len(raw)))
    free_all(lib, new_ctx(lib, id))


def test_null_out_pointers(lib):
    h = new_ctx(lib)
    q, _ = new_queue(lib)
    cases = [
        ("dc_context_new", lambda: lib.dc_context_new(b"abc", 3, ffi.NULL)),
        ("dc_context_new_uuid", lambda: lib.dc_context_new_uuid(ffi.NULL)),
        ("dc_context_state", lambda: lib.dc_context_state(h, ffi.NULL)),
        ("dc_context_state_word", lambda: lib.dc_context_state_word(h, ffi.NULL)),
        ("dc_context_child", lambda: lib.dc_context_child(h, ffi.NULL)),
        ("dc_queue_new", lambda: lib.dc_queue_new(ffi.NULL, ffi.new("int *"))),
        ("dc_queue_new", lambda: lib.dc_queue_new(ffi.new("uint64_t *"), ffi.NULL)),
        ("dc_queue_drain", lambda: lib.dc_queue_drain(q, ffi.new("uint64_t[4]"), 4, ffi.NULL)),
        ("dc_queue_drain", lambda: lib.dc_queue_drain(q, ffi.NULL, 4, ffi.new("size_t *"))),
        ("dc_queue_drain_after", lambda: lib.dc_queue_drain_after(q, ffi.NULL)),
        ("dc_log_fd", lambda: lib.dc_log_fd(ffi.NULL)),
        ("dc_log_next", lambda: lib.dc_log_next(ffi.NULL, ffi.new("char[64]"), 64, ffi.new("size_t *"))),
        ("dc_log_next", lambda: lib.dc_log_next(ffi.new("int *"), ffi.new("char[64]"), 64, ffi.NULL)),
    ]
    before = counts(lib)
    for name, call in cases:
        expect(lib, call(), DC_EINVAL, name)
    assert counts(lib) == before  # nothing was created by the failing calls
    # dc_handle_counts accepts NULL for either pointer.
    ok(lib, lib.dc_handle_counts(ffi.NULL, ffi.NULL, ffi.NULL))
    # A drain with no buffer and cap 0 is valid and takes nothing.
    n = ffi.new("size_t *", 99)
    ok(lib, lib.dc_queue_drain(q, ffi.NULL, 0, n))
    assert n[0] == 0
    free_all(lib, h)
    ok(lib, lib.dc_queue_free(q))


# ---------------------------------------------------------------------------
# Contexts: state word, cancellation, children
# ---------------------------------------------------------------------------


def test_state_word_pointer(lib):
    h = new_ctx(lib)
    p = ffi.new("uint32_t **")
    ok(lib, lib.dc_context_state_word(h, p))
    word = p[0]
    assert word != ffi.NULL
    p2 = ffi.new("uint32_t **")
    ok(lib, lib.dc_context_state_word(h, p2))
    assert p2[0] == word  # one word per context, stable
    assert word[0] == DC_LIVE | DC_REASON_NONE << 8
    ok(lib, lib.dc_context_stop_generating(h))
    # Read without calling into the library: the store happened before the call returned.
    # state | reason << 8 | cause << 16: a direct stop is its own cause.
    assert word[0] == DC_STOPPED | DC_REASON_STOP_GENERATING << 8 | DC_REASON_STOP_GENERATING << 16
    ok(lib, lib.dc_context_kill(h))
    assert word[0] & 0xFF == DC_KILLED
    assert (word[0] >> 8) & 0xFF == DC_REASON_KILL
    assert word[0] >> 16 == DC_REASON_KILL  # the cause: a direct kill is its own
    other = new_ctx(lib)
    ok(lib, lib.dc_context_state_word(other, p2))
    assert p2[0] != word and p2[0][0] == 0
    free_all(lib, h, other)


def test_stop_then_kill_then_stop_is_monotonic(lib):
    h = new_ctx(lib)
    assert state(lib, h) == (DC_LIVE, DC_REASON_NONE)
    ok(lib, lib.dc_context_stop_generating(h))
    assert state(lib, h) == (DC_STOPPED, DC_REASON_STOP_GENERATING)
    ok(lib, lib.dc_context_stop_generating(h))  # idempotent
    ok(lib, lib.dc_context_cancel(h, DC_STOPPED, DC_REASON_DEADLINE))  # already there: unchanged
    assert state(lib, h) == (DC_STOPPED, DC_REASON_STOP_GENERATING)
    ok(lib, lib.dc_context_kill(h))
    assert state(lib, h) == (DC_KILLED, DC_REASON_KILL)
    ok(lib, lib.dc_context_stop_generating(h))  # never backwards
    ok(lib, lib.dc_context_kill(h))
    ok(lib, lib.dc_context_cancel(h, DC_KILLED, DC_REASON_SHUTDOWN))
    ok(lib, lib.dc_context_cancel(h, DC_STOPPED, DC_REASON_DEADLINE))
    assert state(lib, h) == (DC_KILLED, DC_REASON_KILL)
    # kill on a live context goes straight to KILLED.
    k = new_ctx(lib)
    ok(lib, lib.dc_context_kill(k))
    assert state(lib, k) == (DC_KILLED, DC_REASON_KILL)
    free_all(lib, h, k)


@pytest.mark.parametrize("target", [DC_STOPPED, DC_KILLED], ids=["stopped", "killed"])
@pytest.mark.parametrize("reason", list(ALL_REASONS), ids=[REASON_NAMES[r] for r in ALL_REASONS])
def test_cancel_with_each_reason(lib, target, reason):
    h = new_ctx(lib)
    ok(lib, lib.dc_context_cancel(h, target, reason))
    assert state(lib, h) == (target, reason)
    free_all(lib, h)


def test_cancel_rejects_bad_state_and_reason(lib):
    h = new_ctx(lib)
    for bad_state in (DC_LIVE, 3, 0x101, 2**32 - 1):
        expect(lib, lib.dc_context_cancel(h, bad_state, DC_REASON_KILL), DC_EINVAL, "dc_context_cancel")
    for bad_reason in (DC_REASON_NONE, 8, 255, 256 + DC_REASON_KILL, 2**32 - 1):
        for target in (DC_STOPPED, DC_KILLED):
            expect(lib, lib.dc_context_cancel(h, target, bad_reason), DC_EINVAL, "dc_context_cancel")
    assert state(lib, h) == (DC_LIVE, DC_REASON_NONE)  # the rejected calls changed nothing
    free_all(lib, h)


def test_cancel_held_is_cancel_for_a_host(lib):
    """dc_context_cancel_held moves the words as dc_context_cancel does and
    refuses what it refuses. A context only C waits on holds nothing (the
    library's own threads are what it holds: docs/c-abi.md), so *ticket is
    0; dc_run_held with nothing held runs nothing."""
    parent = new_ctx(lib)
    child = new_child(lib, parent)
    ticket = ffi.new("uint64_t *", 7)
    ok(lib, lib.dc_context_cancel_held(parent, DC_KILLED, DC_REASON_SHUTDOWN, ticket))
    assert ticket[0] == 0
    assert state(lib, parent) == (DC_KILLED, DC_REASON_SHUTDOWN)
    assert state(lib, child) == (DC_KILLED, DC_REASON_PARENT)
    ran = ffi.new("size_t *", 7)
    ok(lib, lib.dc_run_held(2**64 - 1, ran))
    assert ran[0] == 0
    ok(lib, lib.dc_run_held(0, ffi.NULL))
    h = new_ctx(lib)
    expect(lib, lib.dc_context_cancel_held(h, DC_LIVE, DC_REASON_KILL, ticket), DC_EINVAL, "dc_context_cancel_held")
    expect(lib, lib.dc_context_cancel_held(h, DC_KILLED, DC_REASON_NONE, ticket), DC_EINVAL, "dc_context_cancel_held")
    expect(lib, lib.dc_context_cancel_held(h, DC_KILLED, DC_REASON_KILL, ffi.NULL), DC_EINVAL, "dc_context_cancel_held")
    assert state(lib, h) == (DC_LIVE, DC_REASON_NONE)
    free_all(lib, parent, child, h)


def test_cancel_local_hands_back_the_tokens_it_fires_on_the_queue(lib):
    """dc_context_cancel_local is dc_context_cancel_held whose tokens for the
    host's own queue come back in toks instead of the fd: the fd stays
    unreadable, and the watch has fired (unwatch finds nothing). Past the
    capacity, tokens go to the fd, in order; tokens for another queue go to
    its fd. Bad arguments change nothing and keep every token."""
    q, fd = new_queue(lib)
    other, other_fd = new_queue(lib)
    h = new_ctx(lib)
    for tok in (11, 12, 13):
        ok(lib, lib.dc_context_watch(h, q, DC_KILLED, tok))
    ok(lib, lib.dc_context_watch(h, other, DC_STOPPED, 21))
    toks, n, ticket = ffi.new("uint64_t[2]"), ffi.new("size_t *", 9), ffi.new("uint64_t *", 9)
    ok(lib, lib.dc_context_cancel_local(h, DC_KILLED, DC_REASON_KILL, q, toks, 2, n, ticket))
    assert state(lib, h) == (DC_KILLED, DC_REASON_KILL)
    assert ticket[0] == 0  # only C waits on it: nothing of the library's to hold
    got = sorted(toks[i] for i in range(n[0]))
    assert n[0] == 2 and set(got) < {11, 12, 13}
    assert readable(fd) and drain(lib, q) == sorted({11, 12, 13} - set(got))  # the one past the capacity
    assert readable(other_fd) and drain(lib, other) == [21]
    for tok in (11, 12, 13):
        expect(lib, lib.dc_queue_unwatch(q, tok), DC_ENOENT, "dc_queue_unwatch")

    # Refused: nothing cancelled, nothing taken from the queue.
    live = new_ctx(lib)
    ok(lib, lib.dc_context_watch(live, q, DC_KILLED, 31))
    name = "dc_context_cancel_local"
    expect(lib, lib.dc_context_cancel_local(live, DC_LIVE, DC_REASON_KILL, q, toks, 2, n, ticket), DC_EINVAL, name)
    assert n[0] == 0
    expect(lib, lib.dc_context_cancel_local(live, DC_KILLED, DC_REASON_KILL, q, ffi.NULL, 2, n, ticket), DC_EINVAL, name)
    expect(lib, lib.dc_context_cancel_local(live, DC_KILLED, DC_REASON_KILL, q, toks, 2, ffi.NULL, ticket), DC_EINVAL, name)
    expect(lib, lib.dc_context_cancel_local(live, DC_KILLED, DC_REASON_KILL, q, toks, 2, n, ffi.NULL), DC_EINVAL, name)
    assert state(lib, live) == (DC_LIVE, DC_REASON_NONE)
    # No room at all: every token goes to the fd.
    ok(lib, lib.dc_context_cancel_local(live, DC_KILLED, DC_REASON_KILL, q, ffi.NULL, 0, n, ticket))
    assert n[0] == 0 and drain(lib, q) == [31]

    # A capacity past what the array holds is the host's promise; one past
    # any int is taken as such, not as a negative count.
    huge = new_ctx(lib)
    ok(lib, lib.dc_context_watch(huge, q, DC_KILLED, 41))
    toks4 = ffi.new("uint64_t[4]")
    ok(lib, lib.dc_context_cancel_local(huge, DC_KILLED, DC_REASON_KILL, q, toks4, 2**64 - 1, n, ticket))
    assert n[0] == 1 and toks4[0] == 41 and not readable(fd)
    # Out-parameters are zeroed on every error.
    n[0] = 9
    expect(lib, lib.dc_context_cancel_local(live, DC_KILLED, DC_REASON_KILL, q, toks, 2, n, ffi.NULL), DC_EINVAL, name)
    assert n[0] == 0

    # dc_queue_push: a host that took tokens it cannot deliver gives them back.
    ok(lib, lib.dc_queue_push(q, ffi.new("uint64_t[3]", [5, 6, 7]), 3))
    ok(lib, lib.dc_queue_push(q, ffi.NULL, 0))
    assert readable(fd) and drain(lib, q) == [5, 6, 7]
    expect(lib, lib.dc_queue_push(q, ffi.NULL, 1), DC_EINVAL, "dc_queue_push")
    free_all(lib, h, live, huge)
    ok(lib, lib.dc_queue_free(q))
    ok(lib, lib.dc_queue_free(other))


def test_state_word_next_is_what_a_cancel_does(lib):
    """dc_state_word_next computes, from a word alone, the word a context gets
    from dc_context_cancel: after every pair of cancels the two agree."""
    cancels = [(t, r) for t in (DC_STOPPED, DC_KILLED) for r in ALL_REASONS]
    out = ffi.new("uint32_t *")
    real = ffi.new("uint32_t *")
    for first in cancels:
        for second in cancels:
            h = new_ctx(lib)
            word = 0
            for target, reason in (first, second):
                ok(lib, lib.dc_state_word_next(word, target, reason, out))
                word = out[0]
                ok(lib, lib.dc_context_cancel(h, target, reason))
                ok(lib, lib.dc_context_state(h, real))
                assert word == real[0], (first, second, hex(word), hex(real[0]))
            free_all(lib, h)
    ok(lib, lib.dc_state_word_next(DC_LIVE, DC_KILLED, DC_REASON_SHUTDOWN, out))
    assert out[0] == DC_KILLED | DC_REASON_SHUTDOWN << 8 | DC_REASON_SHUTDOWN << 16  # a direct cancel's cause is its reason


def test_state_word_next_rejects_what_cancel_rejects(lib):
    out = ffi.new("uint32_t *", 7)
    for bad_state in (DC_LIVE, 3, 0x101, 2**32 - 1):
        expect(lib, lib.dc_state_word_next(0, bad_state, DC_REASON_KILL, out), DC_EINVAL, "dc_state_word_next")
    for bad_reason in (DC_REASON_NONE, 8, 255, 256 + DC_REASON_KILL, 2**32 - 1):
        expect(lib, lib.dc_state_word_next(0, DC_KILLED, bad_reason, out), DC_EINVAL, "dc_state_word_next")
    expect(lib, lib.dc_state_word_next(0, DC_KILLED, DC_REASON_KILL, ffi.NULL), DC_EINVAL, "dc_state_word_next")
    assert out[0] == 7  # nothing stored on failure


def test_children_follow_parent(lib):
    parent = new_ctx(lib, "req-7")
    linked = new_ctx(lib, "other-id")
    ok(lib, lib.dc_context_link_child(parent, linked))
    child = new_child(lib, parent)
    assert ctx_id(lib, child) == "req-7"
    grandchild = new_child(lib, child)
    ok(lib, lib.dc_context_stop_generating(parent))
    for h in (linked, child, grandchild):
        assert state(lib, h) == (DC_STOPPED, DC_REASON_PARENT)
    ok(lib, lib.dc_context_kill(parent))
    assert state(lib, parent) == (DC_KILLED, DC_REASON_KILL)
    for h in (linked, child, grandchild):
        assert state(lib, h) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, parent, linked, child, grandchild)


def test_child_does_not_cancel_parent(lib):
    parent = new_ctx(lib)
    child = new_child(lib, parent)
    ok(lib, lib.dc_context_kill(child))
    assert state(lib, parent) == (DC_LIVE, DC_REASON_NONE)
    free_all(lib, parent, child)


def test_stopped_child_is_killed_by_parent(lib):
    parent = new_ctx(lib)
    child = new_child(lib, parent)
    ok(lib, lib.dc_context_cancel(child, DC_STOPPED, DC_REASON_CLIENT_DISCONNECTED))
    ok(lib, lib.dc_context_kill(parent))
    assert state(lib, child) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, parent, child)


@pytest.mark.parametrize("target", [DC_STOPPED, DC_KILLED], ids=["stopped", "killed"])
def test_link_to_cancelled_parent_applies_at_once(lib, target):
    parent = new_ctx(lib)
    ok(lib, lib.dc_context_cancel(parent, target, DC_REASON_SHUTDOWN))
    child = new_ctx(lib)
    ok(lib, lib.dc_context_link_child(parent, child))
    assert state(lib, child) == (target, DC_REASON_PARENT)
    made = new_child(lib, parent)
    assert state(lib, made) == (target, DC_REASON_PARENT)
    free_all(lib, parent, child, made)


def test_cycles_and_self_links_terminate(lib):
    a, b, c = new_ctx(lib), new_ctx(lib), new_ctx(lib)
    ok(lib, lib.dc_context_link_child(a, a))
    ok(lib, lib.dc_context_link_child(a, b))
    ok(lib, lib.dc_context_link_child(b, c))
    ok(lib, lib.dc_context_link_child(c, a))
    ok(lib, lib.dc_context_link_child(a, b))  # twice is the same as once
    ok(lib, lib.dc_context_stop_generating(b))
    assert state(lib, b) == (DC_STOPPED, DC_REASON_STOP_GENERATING)
    assert state(lib, c) == (DC_STOPPED, DC_REASON_PARENT)
    assert state(lib, a) == (DC_STOPPED, DC_REASON_PARENT)
    ok(lib, lib.dc_context_kill(a))
    assert state(lib, a) == (DC_KILLED, DC_REASON_KILL)
    assert state(lib, b) == (DC_KILLED, DC_REASON_PARENT)
    assert state(lib, c) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, a, b, c)


def test_deep_chain(lib):
    root = new_ctx(lib)
    chain = [root]
    for _ in range(5000):
        chain.append(new_child(lib, chain[-1]))
    ok(lib, lib.dc_context_kill(root))
    assert state(lib, chain[-1]) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, *chain)


def test_finish_unlinks_from_parents(lib):
    parent = new_ctx(lib)
    done = new_child(lib, parent)
    running = new_child(lib, parent)
    below_done = new_child(lib, done)
    ok(lib, lib.dc_context_finish(done))
    ok(lib, lib.dc_context_finish(done))  # idempotent
    ok(lib, lib.dc_context_kill(parent))
    assert state(lib, running) == (DC_KILLED, DC_REASON_PARENT)
    assert state(lib, done) == (DC_LIVE, DC_REASON_NONE)  # no longer follows the parent
    assert state(lib, below_done) == (DC_LIVE, DC_REASON_NONE)
    ok(lib, lib.dc_context_stop_generating(done))  # its own children still follow it
    assert state(lib, below_done) == (DC_STOPPED, DC_REASON_PARENT)
    free_all(lib, parent, done, running, below_done)


def test_freed_handle_context_keeps_propagating(lib):
    parent = new_ctx(lib)
    middle = new_child(lib, parent)
    leaf = new_child(lib, middle)
    free_all(lib, middle)  # the handle goes; the context stays in the tree
    ok(lib, lib.dc_context_kill(parent))
    assert state(lib, leaf) == (DC_KILLED, DC_REASON_PARENT)
    free_all(lib, parent, leaf)

def test_timeout_and_remaining(lib):
    """dc_context_set_timeout kills with DC_REASON_DEADLINE at the deadline; dc_context_remaining
    says how long is left (-1 without a deadline); bad seconds are DC_EINVAL; children keep the
    earlier deadline."""
    import math
    import time

    h = new_ctx(lib, "timeout")
    child = new_child(lib, h)
    out = ffi.new("double *")
    ok(lib, lib.dc_context_remaining(h, out))
    assert out[0] == -1
    for bad in (-1.0, math.nan, math.inf, float(lib.DC_MAX_TIMEOUT_SECONDS)):
        assert "timeout" in expect(lib, lib.dc_context_set_timeout(h, bad), lib.DC_EINVAL, "dc_context_set_timeout")
    ok(lib, lib.dc_context_set_timeout(h, 0.05))
    ok(lib, lib.dc_context_remaining(child, out))
    assert 0 < out[0] <= 0.05
    deadline = time.monotonic() + HANG
    while state(lib, h)[0] != lib.DC_KILLED:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert state(lib, h) == (lib.DC_KILLED, lib.DC_REASON_DEADLINE)
    ok(lib, lib.dc_context_remaining(h, out))
    assert out[0] == 0
    assert state(lib, child)[0] == lib.DC_KILLED
    expect(lib, lib.dc_context_remaining(h, ffi.NULL), lib.DC_EINVAL, "dc_context_remaining")
    free_all(lib, h, child)
    expect(lib, lib.dc_context_set_timeout(h, 1.0), lib.DC_EBADF, "dc_context_set_timeout")


def test_timeout_check_is_the_rule_of_every_timeout(lib):
    """dc_timeout_check refuses exactly what dc_context_set_timeout refuses,
    with the same reason: up to the last second below DC_MAX_TIMEOUT_SECONDS."""
    import math

    h = new_ctx(lib, "timeout-check")
    for good in (0.0, 2.5, float(lib.DC_MAX_TIMEOUT_SECONDS - 1)):
        ok(lib, lib.dc_timeout_check(good))
    for bad in (-1.0, math.nan, math.inf, float(lib.DC_MAX_TIMEOUT_SECONDS)):
        why = expect(lib, lib.dc_timeout_check(bad), lib.DC_EINVAL, "dc_timeout_check").split(": ", 1)[1]
        assert expect(lib, lib.dc_context_set_timeout(h, bad), lib.DC_EINVAL, "dc_context_set_timeout").endswith(why)
    free_all(lib, h)
