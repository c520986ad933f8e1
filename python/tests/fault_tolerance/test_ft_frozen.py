"""A frozen worker (SIGSTOP) beside a healthy one, migration limit 0: no new request fails (one
that its frozen instance never acknowledged is sent to the other: it never reached a worker),
the frozen worker never starts those requests when it wakes (their caller no longer expects
them), and new requests reach it again after SIGCONT. A worker whose event loop is blocked
(its Go side still running) is found out the same way: its streams migrate, new requests
go elsewhere, and it serves again once its loop runs."""

from __future__ import annotations

import re
import sys
import threading
import time


def test_frozen_worker_costs_no_request_and_serves_again_after_sigcont(stack):
    stack.start([{"decode": 0.002}, {"decode": 0.002}], migration_limit=0)
    frozen, healthy = stack.workers
    client = stack.frontend.openai()
    frozen.freeze()
    try:
        ids = [stack.new_id("while-frozen") for _ in range(8)]
        for rid in ids:
            r = client.completions.create(model=stack.model, prompt="tick", max_tokens=3, extra_headers={"x-request-id": rid})
            assert r.usage.completion_tokens == 3
    finally:
        frozen.thaw()
    for rid in ids:
        healthy.wait_log(rf"New Request ID: {re.escape(rid)}(?: |$)")
    time.sleep(1.5)  # the woken worker reads what it missed
    for rid in ids:
        assert frozen.log_count(rf"New Request ID: {re.escape(rid)}(?: |$)") == 0, "started work whose caller had gone"
    # It serves again once the frontend stops avoiding it (a few seconds).
    deadline = time.monotonic() + stack.hang
    while True:
        rid = stack.new_id("after-sigcont")
        client.completions.create(model=stack.model, prompt="tick", max_tokens=1, extra_headers={"x-request-id": rid})
        if frozen.log_count(rf"New Request ID: {re.escape(rid)}(?: |$)"):
            break
        assert time.monotonic() < deadline, "the woken worker never got a request again"
        time.sleep(0.1)


# A worker whose handler blocks its event loop for 10 s once (the first request whose id
# says "wedge"): its Go side still runs, answers the bus and could beat its streams' hearts.
WEDGE = """
import time
from dynamo_ctx.backends import mocker

_generate = mocker.MockAsyncLLM.generate
_wedged = []

async def generate(self, prompt, sampling_params, request_id):
    if "wedge" in request_id and not _wedged:
        _wedged.append(request_id)
        time.sleep(10)  # blocks the event loop: no Python of this process runs meanwhile
    async for out in _generate(self, prompt, sampling_params, request_id):
        yield out

mocker.MockAsyncLLM.generate = generate
from dynamo_ctx.cli.worker import main
main()
"""


def test_wedged_event_loop_is_found_out_and_costs_no_request(stack):
    stack.start([{"decode": 0.01}], migration_limit=1)
    (healthy,) = stack.workers
    # The wedged worker joins the running stack: start() waits until the frontend sees both.
    stack.start([{"decode": 0.01, "name": "worker-wedged", "command": [sys.executable, "-c", WEDGE]}], frontend=False)
    wedged = stack.workers[-1]
    client = stack.frontend.openai()

    results, errors = {}, []

    def stream(rid):
        try:
            out = client.completions.create(model=stack.model, prompt="tick", max_tokens=100, stream=True,
                                            extra_headers={"x-request-id": rid})
            results[rid] = "".join(c.choices[0].text for c in out if c.choices)
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(f"{rid}: {e!r}")

    t0 = time.monotonic()
    ids = [stack.new_id(f"wedge{i}") for i in range(4)]
    threads = [threading.Thread(target=stream, args=(rid,)) for rid in ids]
    for t in threads:
        t.start()
    wedged.wait_log(r"New Request ID: wedge")  # its loop is blocked from here on, for 10 s
    time.sleep(2)
    # New requests while it is wedged: none fails (refused unstarted there, served here).
    for _ in range(6):
        r = client.completions.create(model=stack.model, prompt="tick", max_tokens=3,
                                      extra_headers={"x-request-id": stack.new_id("during")})
        assert r.usage.completion_tokens == 3
    for t in threads:
        t.join(stack.hang)
    took = time.monotonic() - t0
    assert errors == []
    for rid in ids:
        assert results[rid] == stack.expected_text("tick", 100), rid
    assert took < 9.5, f"the streams on the wedged worker waited for its loop ({took:.1f} s): not found out"
    # Once its loop runs again it serves again.
    deadline = time.monotonic() + stack.hang
    while True:
        rid = stack.new_id("after-wedge")
        client.completions.create(model=stack.model, prompt="tick", max_tokens=1, extra_headers={"x-request-id": rid})
        if wedged.log_count(rf"New Request ID: {re.escape(rid)}(?: |$)"):
            break
        assert time.monotonic() < deadline, "the unwedged worker never got a request again"
        time.sleep(0.1)
    assert healthy.running()
