"""``python -m dynamo_ctx.demo``: the demo lives in :mod:`dynamo_ctx.examples.demo`."""

from .examples.demo import _run, main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(_run())
