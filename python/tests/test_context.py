"""Every rule of docs/design.md, section 2, through the Python API."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import threading

import pytest

from dynamo_ctx import Context
from harness import HANG, run_python
from helpers import run
from selftest_library import run_with_test_module



def counts():
    from dynamo_ctx._lib import native

    gc.collect()
    return native().handle_counts()


def test_import_does_not_load_the_library():
    code = (
        "import sys\n"
        "import dynamo_ctx\n"
        "from dynamo_ctx import Context\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'dynamo_ctx._native' not in sys.modules, 'imported'\n"
        "assert '_native.abi3' not in maps, 'mapped'\n"
        "Context()\n"
        "assert '_native.abi3' in open('/proc/self/maps').read()\n"
        "print('ok')\n"
    )
    out = run_python("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert out.stderr == "", "the library never writes to stderr"


def test_ids():
    ctx = Context()
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", ctx.id())
    assert Context().id() != ctx.id()
    assert Context(id="req-42").id() == "req-42"
    assert Context("ünï-cødé-✓").id() == "ünï-cødé-✓"
    long_id = "x" * 256  # the longest (test_context_ids.py has the rule)
    assert Context(long_id).id() == long_id
    assert ctx.child().id() == ctx.id()


@pytest.mark.parametrize("bad", [b"bytes", 42, 1.5, object()])
def test_bad_id_type(bad):
    with pytest.raises(TypeError):
        Context(bad)


@pytest.mark.parametrize("bad", ["", "a\x00b", "x" * 5000, "\udc80"])
def test_bad_id_value(bad):
    with pytest.raises(ValueError):
        Context(bad)


def test_isinstance_and_repr():
    ctx = Context("r")
    assert isinstance(ctx, Context)
    assert isinstance(ctx.child(), Context)
    assert "r" in repr(ctx) and "live" in repr(ctx)
    ctx.kill()
    assert "killed" in repr(ctx)


def test_states_are_monotonic():
    ctx = Context()
    assert not ctx.is_stopped() and not ctx.is_killed() and ctx.reason() is None
    ctx.stop_generating()
    assert ctx.is_stopped() and not ctx.is_killed()
    assert ctx.reason() == "stop_generating"
    ctx.stop_generating()
    assert ctx.reason() == "stop_generating"
    ctx.kill()
    assert ctx.is_stopped() and ctx.is_killed()
    assert ctx.reason() == "kill"
    ctx.stop_generating()
    ctx.kill()
    assert ctx.is_killed() and ctx.reason() == "kill"


def test_kill_on_live_goes_straight_to_killed():
    ctx = Context()
    ctx.kill()
    assert ctx.is_stopped() and ctx.is_killed() and ctx.reason() == "kill"


def test_children_follow_parents():
    parent = Context("p")
    a = parent.child()
    b = Context("b")
    parent.link_child(b)
    grandchild = a.child()
    parent.stop_generating()
    for c in (a, b, grandchild):
        assert c.is_stopped() and not c.is_killed()
        assert c.reason() == "parent"
    parent.kill()
    for c in (a, b, grandchild):
        assert c.is_killed()


def test_child_does_not_cancel_parent():
    parent = Context()
    child = parent.child()
    child.kill()
    assert not parent.is_stopped()


def test_link_to_cancelled_parent_applies_at_once():
    stopped = Context()
    stopped.stop_generating()
    c = Context()
    stopped.link_child(c)
    assert c.is_stopped() and not c.is_killed()
    stopped.kill()  # still linked: the kill follows
    assert c.is_killed()

    killed = Context()
    killed.kill()
    assert killed.child().is_killed()


def test_cycles_terminate():
    a, b, c = Context("a"), Context("b"), Context("c")
    a.link_child(b)
    b.link_child(c)
    c.link_child(a)
    a.link_child(a)
    b.kill()
    assert a.is_killed() and b.is_killed() and c.is_killed()


def test_link_child_type_checked():
    with pytest.raises(TypeError):
        Context().link_child("not a context")  # type: ignore[arg-type]


def test_dropped_children_are_released():
    parent = Context()
    parent._handle()  # its Go side (a Context() alone has none until it is needed)
    base = counts()
    kids = [parent.child() for _ in range(1000)]
    assert counts()["contexts"] == base["contexts"] + 1000
    del kids
    assert counts() == base
    parent.kill()


def kill_under_threads(ctx, target, ready) -> None:
    """Runs target in 4 threads, waits on ready (an Event they set, a Barrier
    they meet at), kills ctx and checks that every thread ends."""
    threads = [threading.Thread(target=target) for _ in range(4)]
    for t in threads:
        t.start()
    ready.wait(HANG)
    ctx.kill()
    for t in threads:
        t.join(HANG)
        assert not t.is_alive()


def test_poll_from_other_threads():
    ctx = Context()
    ready = threading.Event()
    seen = []

    def poller():
        ready.set()
        while not ctx.is_stopped():
            pass
        seen.append((ctx.is_stopped(), ctx.is_killed()))

    kill_under_threads(ctx, poller, ready)
    assert seen == [(True, True)] * 4


def test_cancel_from_many_threads_while_linking():
    for _ in range(20):
        parent = Context()
        kids = [Context() for _ in range(200)]
        barrier = threading.Barrier(5)

        def link(part):
            barrier.wait()
            for k in part:
                parent.link_child(k)

        def kill():
            barrier.wait()
            parent.kill()

        threads = [threading.Thread(target=link, args=(kids[i::4],)) for i in range(4)]
        threads.append(threading.Thread(target=kill))
        for t in threads:
            t.start()
        for t in threads:
            t.join(HANG)
        assert all(k.is_killed() for k in kids)


# ---------------------------------------------------------------- awaitables


def test_awaitables_return_at_once_when_cancelled():
    async def main():
        ctx = Context()
        ctx.kill()
        assert await ctx.async_killed_or_stopped() is True
        assert await ctx.stopped() is True
        assert await ctx.killed() is True

    run(main())


def test_stopped_resolves_on_stop_killed_only_on_kill():
    async def main():
        ctx = Context()
        stopped = asyncio.ensure_future(ctx.stopped())
        killed = asyncio.ensure_future(ctx.killed())
        either = asyncio.ensure_future(ctx.async_killed_or_stopped())
        await asyncio.sleep(0)
        assert not stopped.done()
        ctx.stop_generating()
        assert await stopped is True
        assert await either is True
        # The kill waiter is still pending after the stop has been delivered.
        assert not killed.done()
        ctx.kill()
        assert await killed is True

    run(main())


def test_wake_from_another_thread():
    async def main():
        ctx = Context()
        loop = asyncio.get_running_loop()
        waiter = asyncio.ensure_future(ctx.killed())
        await asyncio.sleep(0)
        t = threading.Thread(target=ctx.kill)
        await loop.run_in_executor(None, lambda: (t.start(), t.join()))
        assert await waiter is True

    run(main())


def test_parent_cancel_wakes_child_waiters():
    async def main():
        parent = Context()
        child = parent.child().child()
        w = asyncio.ensure_future(child.killed())
        await asyncio.sleep(0)
        parent.kill()
        assert await w
        assert child.reason() == "parent"

    run(main())


def test_hundreds_of_waiters_on_one_context():
    async def main():
        ctx = Context()
        waiters = [asyncio.ensure_future(ctx.stopped()) for _ in range(300)]
        waiters += [asyncio.ensure_future(ctx.killed()) for _ in range(300)]
        await asyncio.sleep(0)
        ctx.kill()
        results = await asyncio.gather(*waiters)
        assert results == [True] * 600

    run(main())


def test_several_loops_in_several_threads():
    ctx = Context()
    started = threading.Barrier(5)
    results = []

    def worker():
        async def main():
            w = asyncio.ensure_future(ctx.killed())
            await asyncio.sleep(0)
            started.wait(HANG)
            return await w

        results.append(asyncio.run(asyncio.wait_for(main(), HANG)))

    kill_under_threads(ctx, worker, started)
    assert results == [True] * 4


def test_cancelled_wait_unregisters():
    base = counts()

    async def main():
        ctx = Context()
        for _ in range(100):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ctx.killed(), 0.001)
        task = asyncio.ensure_future(ctx.stopped())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ctx.kill()  # no stale watch may fire into a future that is gone
        assert await ctx.killed()

    asyncio.run(main())
    assert counts() == base, "the loop's queue and every context were released"


def test_many_contexts_many_waits():
    async def main():
        ctxs = [Context(f"r{i}") for i in range(1000)]
        waits = [asyncio.ensure_future(c.async_killed_or_stopped()) for c in ctxs]
        await asyncio.sleep(0)
        for i, c in enumerate(ctxs):
            c.kill() if i % 2 else c.stop_generating()
        assert await asyncio.gather(*waits) == [True] * 1000

    run(main())


# ---------------------------------------------------------------- resources


def test_churn_returns_to_baseline():
    from dynamo_ctx._lib import native

    base = counts()
    stats = native().runtime_stats(True)
    for i in range(100_000):
        c = Context()
        if i % 2:
            c.kill()
        else:
            c.child().stop_generating()
    del c
    assert counts() == base
    after = native().runtime_stats(True)
    assert after["goroutines"] <= stats["goroutines"], "no goroutine per context"
    # 100k contexts of ~200 B each would be ~20 MB if anything kept them.
    assert after["heap_bytes"] - stats["heap_bytes"] < 5_000_000


def test_fork_child_gets_clear_error():
    ctx = Context()  # the library is loaded in this process
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report what happened through the pipe, never return into pytest
        code = 1
        try:
            try:
                Context()
                msg = b"no error"
            except RuntimeError as e:
                msg = str(e).encode()[:200]
                code = 0 if b"fork" in msg else 2
            os.write(w, msg)
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    msg = os.read(r, 1000)
    os.close(r)
    assert os.WEXITSTATUS(status) == 0, msg
    assert ctx.id()  # the parent is unaffected


def _scenario_go_panic_is_an_exception_and_logged() -> None:
    from dynamo_ctx._lib import drain_logs, native, set_native_log_level

    records: list = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    log = logging.getLogger("dynamo_ctx")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    set_native_log_level(logging.DEBUG)
    with pytest.raises(RuntimeError, match="panic"):
        native().selftest_panic()
    assert Context().id()  # still usable
    drain_logs()
    # the log thread may have forwarded it already; either way it arrived
    assert any("panic" in r.getMessage() and r.levelno == logging.ERROR for r in records)
    assert all(r.name == "dynamo_ctx" for r in records if "panic" in r.getMessage())


def test_go_panic_is_an_exception_and_logged(selftest_library):
    # selftest_panic is the test library's alone: in a fresh interpreter
    # whose dynamo_ctx._native it is.
    run_with_test_module("test_context", "_scenario_go_panic_is_an_exception_and_logged", selftest_library)


def test_the_shipped_module_has_no_test_hook():
    from dynamo_ctx._lib import native

    assert not hasattr(native(), "selftest_panic")


def test_plain_context_needs_no_go_side():
    """Creating, polling, cancelling and dropping a context never enters Go."""
    base = counts()
    ctxs = [Context(id=f"r{i}") for i in range(100)] + [Context() for _ in range(100)]
    for c in ctxs[::2]:
        c.stop_generating()
    for c in ctxs[::3]:
        c.kill()
    assert counts() == base
    assert [c.is_killed() for c in ctxs] == [i % 3 == 0 for i in range(200)]
    assert [c.is_stopped() for c in ctxs] == [i % 2 == 0 or i % 3 == 0 for i in range(200)]
    assert ctxs[0].reason() == "kill" and ctxs[2].reason() == "stop_generating" and ctxs[1].reason() is None
    ctxs[2].kill()
    assert ctxs[2].reason() == "kill"
    ctxs[0].stop_generating()  # never backwards
    assert ctxs[0].reason() == "kill"
    del ctxs, c
    assert counts() == base


def test_lazy_context_keeps_its_state_and_id_when_materialized():
    """The Go side, made when first needed, starts from what the context already is."""
    for cancel, state in ((None, None), ("stop_generating", "stop_generating"), ("kill", "kill")):
        c = Context(id="lazy-1")
        if cancel:
            getattr(c, cancel)()
        child = c.child()  # needs the Go side
        assert child.id() == "lazy-1"
        assert child.reason() == (None if state is None else "parent")
        assert c.reason() == state
        c.kill()
        assert child.is_killed()
    u = Context()
    first = u.id()
    assert first == u.id() and len(first) == 36
    assert u.child().id() == first


def test_lazy_context_follows_the_librarys_transition_rule():
    """A context without its Go side moves its word by the library's rule
    (dc_state_word_next): after any two cancels its word is what a context
    with a Go side has, and a bad state or reason is refused alike."""
    from dynamo_ctx._lib import native

    lib = native()
    cancels = [(state, reason) for state in (lib.STOPPED, lib.KILLED) for reason in range(1, lib.REASON_SHUTDOWN + 1)]
    for first in cancels:
        for second in cancels[:: len(cancels) // 4]:
            lazy, real = Context(), Context()
            real._handle()  # made now: its cancels go to the library's context
            for c in (lazy, real):
                c._cancel(*first)
                c._cancel(*second)
            assert lazy._state_word() == real._state_word(), (first, second)
            assert lazy._handle() and lazy._state_word() == real._state_word()  # kept when made
    for bad in ((lib.LIVE, lib.REASON_KILL), (3, lib.REASON_KILL), (lib.KILLED, 0), (lib.KILLED, lib.REASON_SHUTDOWN + 1)):
        for c in (Context(), Context().child()):
            with pytest.raises(ValueError, match="state must be|unknown reason"):
                c._cancel(*bad)
            assert c._state_word() == 0


def test_invalid_ids_rejected_at_creation():
    for bad in ("", "a\x00b", "x" * 5000, "\ud800"):
        with pytest.raises((ValueError, UnicodeEncodeError)):
            Context(id=bad)
    with pytest.raises(TypeError):
        Context(id=42)


def test_cancel_on_the_loop_thread_is_delivered_at_once():
    """A kill made on a running loop's thread resolves that loop's waiters
    without waiting for the loop to poll its fd: one iteration later the
    waiter has run."""

    async def main():
        for cancel in (lambda c: c.kill(), lambda c: c.stop_generating()):
            ctx = Context()
            waiter = asyncio.ensure_future(ctx.stopped())
            await asyncio.sleep(0)  # the watch is registered
            cancel(ctx)
            await asyncio.sleep(0)
            assert waiter.done() and waiter.result() is True

    asyncio.run(main())


def test_kill_epoch_counts_kills():
    """The library counts kills where Python reads them without calling into Go
    (ResponseStream asks the library whether it is killed only after a change)."""
    from dynamo_ctx._lib import native

    lib = native()
    parent = Context()
    child = Context()
    parent.link_child(child)
    e0 = lib.kill_epoch()
    parent.stop_generating()
    assert lib.kill_epoch() == e0  # a stop is not a kill
    parent.kill()
    assert lib.kill_epoch() == e0 + 2  # parent and child, counted when kill() returns
    parent.kill()
    assert lib.kill_epoch() == e0 + 2


def test_timeout_kills_with_reason_deadline():
    ctx = Context(timeout=0.05)
    left = ctx.remaining()
    assert left is not None and 0 < left <= 0.05
    assert Context().remaining() is None
    assert Context(id="x").remaining() is None

    async def main():
        assert await asyncio.wait_for(ctx.killed(), HANG)

    run(main())
    assert ctx.is_killed() and ctx.reason() == "deadline"
    assert ctx.remaining() == 0.0
    zero = Context(timeout=0)
    assert zero.is_killed() and zero.reason() == "deadline"


def test_children_keep_the_earlier_deadline():
    parent = Context(timeout=30)
    child = parent.child()
    assert 29 < child.remaining() <= 30
    early = Context(timeout=5)
    parent.link_child(early)
    assert early.remaining() <= 5  # its own, earlier
    late = Context(timeout=300)
    parent.link_child(late)
    assert late.remaining() <= 30
    parent.kill()
    assert child.is_killed() and child.reason() == "parent"


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), 1e12])
def test_bad_timeout_value(bad):
    with pytest.raises(ValueError, match="timeout"):
        Context(timeout=bad)


@pytest.mark.parametrize("bad", ["1", True, [1], object()])
def test_bad_timeout_type(bad):
    with pytest.raises(TypeError, match="timeout"):
        Context(timeout=bad)


def test_context_module_state_values_come_from_the_library() -> None:
    """``dynamo_ctx.context.STOPPED`` and friends are the library's values."""
    import dynamo_ctx.context as context_module
    from dynamo_ctx._lib import native

    assert (context_module.LIVE, context_module.STOPPED, context_module.KILLED) == (native().LIVE, native().STOPPED, native().KILLED)
    with pytest.raises(AttributeError):
        context_module.NOT_A_STATE  # noqa: B018
