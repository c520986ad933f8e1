"""``python -m dynamo_ctx.frontend``: the OpenAI-compatible HTTP frontend.

The command lives in :mod:`dynamo_ctx.cli.frontend`; this module keeps the
documented name (and ``from dynamo_ctx.frontend import HttpFrontend``).
"""

from .cli.frontend import HttpFrontend, main

__all__ = ["HttpFrontend", "main"]

if __name__ == "__main__":
    main()
