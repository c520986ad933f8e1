"""The commands: ``python -m dynamo_ctx.frontend`` (cli/frontend.py),
``python -m dynamo_ctx.worker`` (cli/worker.py) and what they share:
cli/_args.py (arguments, their variables and value types), cli/_errors.py
(one-line failures, exit codes), cli/_logging.py (log output) and
cli/_runner.py (the event loop, the runtime's connection)."""
