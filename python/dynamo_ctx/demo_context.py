"""``python -m dynamo_ctx.demo_context``: the demo lives in :mod:`dynamo_ctx.examples.demo_context`."""

import asyncio

from .examples.demo_context import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
