"""What the Python tests share besides fixtures (those are in conftest.py)."""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")

HANG = 60  # seconds: a wait this long means something hangs (bounds catch hangs, they do not time)


def run(coro: "Coroutine[Any, Any, T]") -> T:
    """Run ``coro`` on a fresh event loop, failing if it takes longer than 2 * HANG."""
    return asyncio.run(asyncio.wait_for(coro, 2 * HANG))
