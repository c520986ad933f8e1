"""Adversarial tests against a frontend and mock workers running as processes.

- Two HTTP clients with the same ``x-request-id``: one disconnects, the other's
  completion is unaffected and token-exact; only the first is aborted in the engine.
- A body over the frontend's limit gets 413 without the frontend's memory following it.
- Connections to a worker's metrics port that never finish their request are released
  by the read deadline, and past the connection cap new ones are closed at once.
- A flood of silent connections to the frontend's stream port (where workers
  connect their response streams) keeps no request from completing.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import List, Tuple

from harness import free_port

SLOW_DECODE = 0.01  # 100 tokens/s


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_request_id_collision(stack):
    stack.start([{"mode": "agg", "decode": SLOW_DECODE}])
    fe, worker = stack.frontend, stack.worker("agg")
    f0, w0 = fe.metrics(), worker.metrics()
    rid = stack.new_id("shared")
    prompt, n = "the victim's prompt", 60
    # The attacker squats the id first with a long request, then disconnects while
    # the victim's request with the same id is decoding.
    attacker = stack.open_stream({"model": stack.model, "prompt": "attack", "max_tokens": 5000}, {"x-request-id": rid})
    assert attacker.status == 200
    attacker.event()
    victim = stack.open_stream({"model": stack.model, "prompt": prompt, "max_tokens": n}, {"x-request-id": rid})
    assert victim.status == 200
    text = victim.event()["choices"][0]["text"]
    attacker.close()
    finish = None
    while True:
        ev = victim.event()
        if ev is None:
            break
        text += ev["choices"][0]["text"]
        finish = ev["choices"][0]["finish_reason"] or finish
    victim.close()
    assert text == stack.expected_text(prompt, n), "the victim's completion is not token-exact"
    assert finish == "length"
    # The attacker's request alone was aborted, and its abort confirmed.
    stack.assert_cancelled(worker, rid, w0, f0)
    assert worker.log_count(rf"New Request ID: {rid}(?: |$)") == 2
    assert worker.log_count(rf"Aborted Request ID: {rid}(?: |$)") == 1
    m = fe.metrics()
    assert m["requests"] == f0["requests"] + 2
    assert m["cancellations"] == f0["cancellations"] + 1


def raw_post(host: str, port: int, size: int, timeout: float) -> Tuple[int, bytes]:
    """POST a body of ``size`` bytes (sent by a thread that stops when the server closes); the status and body.

    Not the harness's clients: those send the whole body before reading the answer,
    and this one must keep sending 64 MiB while the frontend answers 413 early and
    closes, as an attacker's client would."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode())

    def send() -> None:
        chunk = b'{"model":"m","prompt":"' + b"x" * (64 * 1024)
        sent = 0
        try:
            while sent < size:
                sock.sendall(chunk[: size - sent])
                sent += len(chunk)
        except OSError:
            pass

    t = threading.Thread(target=send, daemon=True)
    t.start()
    f = sock.makefile("rb")
    status = int(f.readline().split()[1])
    length = 0
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    body = f.read(length)
    f.close()
    sock.close()
    t.join(timeout)
    return status, body


def test_oversized_body(stack):
    stack.start([{"mode": "agg"}])
    fe = stack.frontend
    host, port = fe.host_port
    before = rss_bytes(fe.pid)
    results: List[Tuple[int, bytes]] = []
    threads = [threading.Thread(target=lambda: results.append(raw_post(host, port, 64 << 20, stack.hang))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(stack.hang)
    assert len(results) == 4
    for status, body in results:
        assert status == 413, body
        err = json.loads(body)["error"]
        assert err["code"] == "request_too_large"
        assert set(err) == {"message", "type", "param", "code"}
    grown = rss_bytes(fe.pid) - before
    # Four 64 MiB bodies; the frontend reads at most 4 MiB of each.
    assert grown < 96 << 20, f"the frontend's RSS grew by {grown >> 20} MiB"
    # max_tokens beyond the model's context length: 400, before any worker sees it.
    client = fe.openai()
    import openai

    try:
        client.completions.create(model=stack.model, prompt="hi", max_tokens=10**12)
        raise AssertionError("max_tokens 10^12 was accepted")
    except openai.BadRequestError as e:
        assert e.code == "context_length_exceeded"
    assert stack.worker("agg").log_count(r"New Request ID") == 0
    assert fe.metrics()["requests"] == 0


def test_metrics_half_open_released(stack):
    timeout, cap = 3.0, 64
    stack.start([{"mode": "agg", "args": ["--metrics-read-timeout", str(timeout), "--metrics-max-connections", str(cap)]}], frontend=False)
    worker = stack.workers[0]
    n = cap + 36
    socks = []
    opened = time.monotonic()
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", worker.metrics_port), timeout=stack.hang)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
        socks.append(s)
    closed_at = [0.0] * n

    def wait_closed(i: int) -> None:
        try:
            while socks[i].recv(4096):
                pass
        except OSError:
            pass
        closed_at[i] = time.monotonic() - opened

    threads = [threading.Thread(target=wait_closed, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(stack.hang)
    for s in socks:
        s.close()
    assert all(0 < c < stack.hang for c in closed_at), closed_at
    early = sum(1 for c in closed_at if c < timeout * 2 / 3)
    held = sum(1 for c in closed_at if c >= timeout * 2 / 3)
    # Past the cap, connections are closed at once; the others by the read deadline.
    assert early >= n - cap, f"{early} closed early, {held} by the deadline"
    assert held <= cap
    # The listener still serves.
    assert "dynamo_ctx_worker" in " ".join(worker.metrics())


class SilentFlood:
    """Connections to ``port`` that never send a byte: ``n`` at once, then ``rate`` a second on a
    thread until ``stop()``, keeping at most ``keep`` of its own ends open (the oldest are closed)."""

    def __init__(self, port: int, n: int, rate: float, keep: int) -> None:
        self.port, self.rate, self.keep = port, rate, keep
        self.socks: List[socket.socket] = []
        self.opened = 0
        for _ in range(n):
            self._open()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="silent-flood")
        self._thread.start()

    def _open(self) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=1.0)
        except OSError:
            return  # the listen queue is full: the flood goes on
        self.opened += 1
        self.socks.append(s)
        while len(self.socks) > self.keep:
            self.socks.pop(0).close()

    def _run(self) -> None:
        while not self._stop.wait(1.0 / self.rate):
            self._open()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self.socks:
            s.close()


def test_stream_port_flood(stack):
    """Anyone on the machine can reach a caller's stream port. While one process holds more
    silent connections there than the frontend keeps without a Hello (512) and opens 300
    more a second, for longer than the connect timeout (3 s), every request still completes
    token-exact: before eviction, the workers' stream connections waited behind the flood
    until the connect timeout failed them."""
    stack.start([{"mode": "agg"}], frontend=False)
    stream_port = free_port()
    stack.env["DYNAMO_CTX_STREAM_ADDR"] = f"127.0.0.1:{stream_port}"
    stack.start([])  # the frontend alone listens on that stream port
    fe = stack.frontend
    client = fe.openai()
    client.completions.create(model=stack.model, prompt="warm", max_tokens=2)
    flood = SilentFlood(stream_port, 600, rate=300, keep=1500)
    try:
        t0 = time.monotonic()
        done = 0
        while time.monotonic() - t0 < 4.0:
            prompt = f"through the flood {done}"
            out = client.completions.create(model=stack.model, prompt=prompt, max_tokens=8)
            assert out.choices[0].text == stack.expected_text(prompt, 8)
            done += 1
    finally:
        flood.stop()
    assert done >= 3
    assert flood.opened > 600
    assert stack.worker("agg").log_count(r"could not connect the response stream") == 0
