"""Where the commands' logs go: one handler on stderr, in text or as one
JSON object per line, for Python's records and the library's. The flags
that choose the level and the format are _args.py's (``add_logging``)."""

from __future__ import annotations

import datetime
import json
import logging
import sys
import traceback

from .. import _lib
from ._args import log_levels

#: The text format: [created] is the epoch time in seconds with microseconds,
#: which benchmarks compare with a client's clock on the same machine.
TEXT_FORMAT = "%(asctime)s [%(created).6f] %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (RFC 3339, UTC), level, target (the
    logger), message, and request_id, reason (an abort's) and exception when the
    record has them."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="microseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "target": record.name,
            "message": record.getMessage(),
        }
        for field in ("request_id", "reason"):
            value = getattr(record, field, None)
            if value is not None:
                out[field] = value
        if record.exc_info:
            out["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(out, ensure_ascii=False)


def setup_logging(spec: str, fmt: str) -> None:
    """One handler on the root logger, on stderr, for Python's records and the
    library's (which reach the ``dynamo_ctx`` logger through its log queue),
    at the levels of ``spec`` (_args.log_levels: the root's, then each named
    logger's). A library already loaded (a value it checked while the
    arguments were read) took the level of then: it is told the new one."""
    level, targets = log_levels(spec)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name, target_level in targets.items():
        logging.getLogger(name).setLevel(target_level.upper())
    if _lib.loaded():
        _lib.set_native_log_level(_lib.logger.getEffectiveLevel())
