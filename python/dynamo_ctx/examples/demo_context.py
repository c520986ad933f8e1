"""A short demonstration of request contexts: `python -m dynamo_ctx.demo_context`.

A pretend request fans out to a decode step and a prefill step (children of
the request's context); a handler polls is_stopped() per token while a
monitor awaits killed(). The client "hangs up" and every piece stops.
"""

from __future__ import annotations

import asyncio
import time

from dynamo_ctx import Context


async def decode(ctx: Context, produced: list) -> str:
    for token in range(1_000_000):
        if ctx.is_stopped():
            return f"stopped after {token} tokens ({ctx.reason()})"
        produced.append(token)
        await asyncio.sleep(0)
    return "finished"


async def monitor(ctx: Context, name: str, log: list) -> None:
    await ctx.killed()
    log.append((name, ctx.reason(), time.perf_counter()))


async def main() -> int:
    request = Context("req-demo-1")
    decode_ctx = request.child()
    prefill_ctx = decode_ctx.child()
    produced: list = []
    log: list = []
    monitors = [
        asyncio.ensure_future(monitor(decode_ctx, "decode monitor", log)),
        asyncio.ensure_future(monitor(prefill_ctx, "prefill monitor", log)),
    ]
    task = asyncio.ensure_future(decode(decode_ctx, produced))
    while len(produced) < 50:
        await asyncio.sleep(0)
    t_kill = time.perf_counter()
    request.kill()  # the client hung up
    outcome = await task
    await asyncio.gather(*monitors)
    print(f"request {request.id()}: killed ({request.reason()})")
    print(f"  decode:  {outcome}; stop seen {1e6 * (time.perf_counter() - t_kill):.0f} us after the kill")
    for name, reason, woke in log:
        print(f"  {name}: killed (reason {reason}), awoke {1e6 * (woke - t_kill):.0f} us after the kill")
    print(f"  decode context id {decode_ctx.id()!r}, prefill context id {prefill_ctx.id()!r}: the id follows every hop")
    ok = decode_ctx.is_killed() and prefill_ctx.is_killed() and prefill_ctx.reason() == "parent"
    print("all work stopped" if ok else "LEAK: something kept running")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
