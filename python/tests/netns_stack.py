"""A stack on the default NATS address, driven from stdin, for tests that run one
in each of several network namespaces (test_network_namespaces.py).

Run it inside the namespace (every process it starts is then in it too). Each line
on stdin is one step; after each it prints ``{"event": "done", "op": ..., "ok": ...,
"error": ...}``:

    frontend    start ``python -m dynamo_ctx.frontend`` (no NATS_SERVER: the default
                address, whose embedded server the first process of the namespace hosts)
    worker      start a mock worker, and check that it connects, that the frontend
                lists it and that a completion through the frontend is served
    stop        stop the worker, then the frontend (SIGTERM: each leaves cleanly)

It exits when stdin closes, stopping what runs.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

from harness import MODEL, Frontend, Worker, child_env, new_namespace

ENV = child_env()  # no NATS_SERVER: the default address
NAMESPACE = new_namespace("netns")


class Stack:
    def __init__(self) -> None:
        self.frontend: Optional[Frontend] = None
        self.worker: Optional[Worker] = None
        self.workers = 0

    def start_frontend(self) -> None:
        assert self.frontend is None, "a frontend runs already"
        self.frontend = Frontend("frontend", ENV, namespace=NAMESPACE)
        self.frontend.ready()

    def start_worker(self) -> None:
        assert self.frontend is not None and self.worker is None, "start a frontend first"
        self.workers += 1
        self.worker = Worker(f"worker-{self.workers}", ENV, namespace=NAMESPACE)
        self.worker.ready()
        self.frontend.wait_instances(1)
        status, _, body = self.frontend.request_json(
            "POST", "/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 3})
        assert status == 200, f"completion: {status} {body}"

    def stop(self) -> None:
        problems = []
        for proc in (self.worker, self.frontend):
            if proc is not None:
                problems.append(proc.stop())
                if proc.returncode not in (0, None):
                    problems.append(f"{proc.name} exited with {proc.returncode}:\n{proc.tail()}")
        self.worker = self.frontend = None
        problems = [p for p in problems if p]
        assert not problems, "; ".join(problems)


def main() -> None:
    stack = Stack()
    steps = {"frontend": stack.start_frontend, "worker": stack.start_worker, "stop": stack.stop}
    try:
        for line in sys.stdin:
            op = line.strip()
            reply: dict[str, Any] = {"event": "done", "op": op, "ok": True, "error": ""}
            try:
                steps[op]()
            except Exception as e:  # reported to the test, which fails with it
                reply.update(ok=False, error=f"{type(e).__name__}: {e}")
            print(json.dumps(reply), flush=True)
    finally:
        try:
            stack.stop()
        except AssertionError:
            pass


if __name__ == "__main__":
    main()
