"""The commands: ``python -m dynamo_ctx.frontend`` (cli/frontend.py),
``python -m dynamo_ctx.worker`` (cli/worker.py) and what they share
(cli/_common.py: arguments, environment, logging, exit codes)."""
