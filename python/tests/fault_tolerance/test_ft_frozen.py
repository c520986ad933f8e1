"""A frozen worker (SIGSTOP) beside a healthy one, migration limit 0: no new request fails (one
that its frozen instance never acknowledged is sent to the other: it never reached a worker),
the frozen worker never starts those requests when it wakes (their caller no longer expects
them), and new requests reach it again after SIGCONT."""

from __future__ import annotations

import re
import signal
import time


def test_frozen_worker_costs_no_request_and_serves_again_after_sigcont(stack):
    stack.start([{"decode": 0.002}, {"decode": 0.002}], migration_limit=0)
    frozen, healthy = stack.workers
    client = stack.frontend.openai()
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        ids = [stack.new_id("while-frozen") for _ in range(8)]
        for rid in ids:
            r = client.completions.create(model=stack.model, prompt="tick", max_tokens=3, extra_headers={"x-request-id": rid})
            assert r.usage.completion_tokens == 3
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
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
