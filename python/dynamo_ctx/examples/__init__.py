"""Demos, not part of the library's API: ``python -m dynamo_ctx.demo``
(examples/demo.py, the whole stack through the OpenAI client) and
``python -m dynamo_ctx.demo_context`` (examples/demo_context.py)."""
