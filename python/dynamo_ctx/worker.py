"""``python -m dynamo_ctx.worker``: a vLLM-style worker on the mock engine or vLLM.

The command lives in :mod:`dynamo_ctx.cli.worker`; this module keeps the
documented name.
"""

from .cli.worker import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
