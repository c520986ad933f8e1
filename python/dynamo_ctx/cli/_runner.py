"""How a command runs: its main coroutine on the event loop it chose
(--event-loop), every failure turned into one line on stderr (_errors.py),
and its runtime connected off the loop."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Optional

from ._errors import CommandError, UsageError, connect_error, fail

if TYPE_CHECKING:
    from ..runtime import DistributedRuntime

logger = logging.getLogger("dynamo_ctx.cli")


async def connect_runtime(nats_url: Optional[str]) -> "DistributedRuntime":
    """A DistributedRuntime on nats_url, made off the event loop (connecting
    blocks); one that cannot connect is the one-line connect_error."""
    from ..runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(None, lambda: DistributedRuntime(nats_url=nats_url))
    except (RuntimeError, OSError, ValueError) as e:
        if getattr(e, "code_name", "") == "ECONNECT":
            raise connect_error(e, nats_url) from None
        raise


def loop_runner(choice: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    """What runs a command's main coroutine for ``--event-loop choice``:
    ``uvloop.run`` or ``asyncio.run``."""
    if choice == "asyncio":
        return asyncio.run
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise UsageError("--event-loop uvloop: uvloop is not installed; install it or choose --event-loop asyncio") from None
        return asyncio.run
    return uvloop.run


def run_command(prog: str, main: Callable[[], Coroutine[Any, Any, None]], debug: bool, event_loop: str = "auto") -> None:
    """Run ``main()`` to completion on ``event_loop`` (see ``loop_runner``);
    every failure ends the process with one line on stderr (and, with
    ``debug``, the traceback in the log first)."""
    try:
        runner = loop_runner(event_loop)
        logger.debug("%s runs on %s", prog, "uvloop" if runner is not asyncio.run else "asyncio's event loop")
        runner(main())
    except CommandError as e:
        fail(prog, str(e), e.status)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as e:  # noqa: BLE001 - anything else is reported, not dumped
        if debug:
            logger.exception("%s failed", prog)
        hint = "" if debug else " (run with --log-level debug for the traceback)"
        fail(prog, f"{type(e).__name__}: {e}{hint}", 1)
