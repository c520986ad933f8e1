"""Clients of the frontend's streamed completions (SSE).

``stream_completion`` is a minimal asyncio HTTP/1.0 client: HTTP/1.0 makes the Go
server send the body unchunked and close the connection at its end, so the client
needs no chunked decoding; hundreds or thousands of these run concurrently on one
event loop (the soak test, the fault tests). streams_through_fault is the fault
tests' run of many streams across one fault.

``SSEStream`` reads one stream event by event from a raw socket (blocking, for a
test's threads), so that a test can act between two events: drop the connection,
open another.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple


@dataclass
class Result:
    """What one streamed completion delivered."""

    rid: str
    status: int = 0
    texts: List[str] = field(default_factory=list)
    finish: Optional[str] = None
    done: bool = False  # saw "data: [DONE]"
    error: str = ""
    first_item: float = 0.0  # monotonic time of the first text chunk
    last_item: float = 0.0
    max_gap: float = 0.0  # the longest wait between two text chunks (a stall, a migration)
    stamps: List[float] = field(default_factory=list)  # monotonic time of each text chunk
    ended: float = 0.0

    @property
    def text(self) -> str:
        return "".join(self.texts)


async def stream_completion(
    host_port: Tuple[str, int], model: str, prompt: str, max_tokens: int, rid: str,
    stop_after: Optional[int] = None, stream: bool = True, res: Optional[Result] = None,
    extra: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None,
) -> Result:
    """POST /v1/completions and read the stream; ``stop_after``: close the socket after that many chunks.

    ``res``: fill this Result (still readable if the caller cancels the call). ``extra``:
    more fields of the request (``temperature``, ...); ``headers``: more headers."""
    res = res if res is not None else Result(rid)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, **(extra or {})}).encode()
    more = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"POST /v1/completions HTTP/1.0\r\nHost: {host_port[0]}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nx-request-id: {rid}\r\n{more}\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(*host_port)
    try:
        writer.write(head + body)
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.split()
        res.status = int(parts[1]) if len(parts) > 1 else 0
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        if res.status != 200 or not stream:
            rest = await reader.read()
            if res.status == 200:
                d = json.loads(rest)
                res.texts.append(d["choices"][0]["text"])
                res.finish = d["choices"][0].get("finish_reason")
                res.done = True
            else:
                res.error = rest.decode(errors="replace")[:300]
            return res
        while True:
            line = await reader.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                res.done = True
                break
            d = json.loads(data)
            if "error" in d:
                res.error = json.dumps(d["error"])[:300]
                continue
            ch = d["choices"][0]
            if ch.get("text"):
                now = time.monotonic()
                if not res.texts:
                    res.first_item = now
                else:
                    res.max_gap = max(res.max_gap, now - res.last_item)
                res.last_item = now
                res.stamps.append(now)
                res.texts.append(ch["text"])
            if ch.get("finish_reason"):
                res.finish = ch["finish_reason"]
            if stop_after is not None and len(res.texts) >= stop_after:
                break
        return res
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    finally:
        res.ended = time.monotonic()
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


async def streams_through_fault(
    stack, fault: Callable[[], None], prompts: List[str], max_tokens: int, tag: str, after: str
) -> Tuple[List[Result], Optional[float], float]:
    """Streams one completion of each prompt through the stack's frontend and
    calls ``fault()`` (in a thread) once they flow (0.7 s in, none finished),
    then requests ``after`` (3 tokens, not streamed) until one succeeds
    token-exact. Returns (the streams' results, seconds from the fault to that
    success or None within stack.hang, seconds from the start until every
    stream ended)."""
    hp = stack.frontend.host_port
    tasks = [
        asyncio.ensure_future(stream_completion(hp, stack.model, prompt, max_tokens, stack.new_id(f"{tag}{i}")))
        for i, prompt in enumerate(prompts)
    ]
    t0 = time.monotonic()
    await asyncio.sleep(0.7)
    assert not any(t.done() for t in tasks), "streams ended before the fault: the mock is too fast"
    t_fault = time.monotonic()
    await asyncio.get_running_loop().run_in_executor(None, fault)
    recovered = None
    while recovered is None and time.monotonic() - t_fault < stack.hang:
        r = await stream_completion(hp, stack.model, after, 3, stack.new_id("after"), stream=False)
        if r.status == 200 and r.text == stack.expected_text(after, 3):
            recovered = time.monotonic() - t_fault
        else:
            await asyncio.sleep(0.01)
    results = await asyncio.wait_for(asyncio.gather(*tasks), stack.hang)
    return results, recovered, time.monotonic() - t0


def check_streams(stack, prompts: List[str], max_tokens: int, results: List[Result],
                  recovered: Optional[float], label: str, fault: str = "fault") -> None:
    """Asserts that every stream of ``streams_through_fault`` completed
    token-exact (status 200, its end, finish ``length``, no error) and that a
    request succeeded after the fault, after printing one line that
    python/benchmarks/bench_faults.py reads: ``<label>: ok/n streams complete
    token-exact; <fault> -> next success <ms> ms; longest gap in a stream
    <ms> ms``."""
    bad = []
    for i, (prompt, r) in enumerate(zip(prompts, results)):
        want = stack.expected_text(prompt, max_tokens)
        if not (r.status == 200 and r.done and r.finish == "length" and r.text == want and not r.error):
            bad.append((i, r.status, r.done, r.finish, r.error, len(r.texts), r.text == want))
    print(f"{label}: {len(results) - len(bad)}/{len(results)} streams complete token-exact; "
          f"{fault} -> next success {recovered if recovered is None else round(recovered * 1000)} ms; "
          f"longest gap in a stream {max(r.max_gap for r in results) * 1000:.0f} ms")
    assert not bad, f"{len(bad)} streams lost or wrong: {bad[:5]}"
    assert recovered is not None, f"no request succeeded after the {fault}"


class SSEStream:
    """The response on ``sock`` (a streamed completion sent on it, e.g. by
    ``send_post``), read event by event; ``status`` is its HTTP status. The
    frontend writes each event in one piece, so its ``data:`` lines are read
    as lines of the body whatever framing carries them. Closes the socket at
    ``close()`` or at the end of a ``with`` block."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.f = sock.makefile("rb")
        parts = self.f.readline().split()
        self.status = int(parts[1]) if len(parts) > 1 else 0
        while self.f.readline() not in (b"\r\n", b"\n", b""):
            pass

    def __enter__(self) -> "SSEStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def data(self) -> Iterator[str]:
        """Each event's data (``[DONE]`` too) until the connection ends."""
        for line in self.f:
            line = line.strip()
            if line.startswith(b"data: "):
                yield line[len(b"data: "):].decode()

    def event(self) -> Optional[dict]:
        """The next event's JSON, None for ``[DONE]``; fails if the stream ends first."""
        for data in self.data():
            return None if data == "[DONE]" else json.loads(data)
        raise AssertionError("the stream ended without [DONE]")

    def close(self) -> None:
        self.f.close()
        self.sock.close()
