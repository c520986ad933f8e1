"""``python -m dynamo_ctx.demo``: the demo lives in :mod:`dynamo_ctx.examples.demo`."""

from .examples.demo import Proc, _run, free_port, http_get, main, wait_until

__all__ = ["Proc", "free_port", "http_get", "main", "wait_until"]

if __name__ == "__main__":
    raise SystemExit(_run())
