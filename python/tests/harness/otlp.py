"""A real OTLP trace receiver for the trace tests: the OpenTelemetry Collector's own
otlpreceiver component (OTLP over HTTP on an ephemeral port of 127.0.0.1), in a process
of its own, writing each span it receives as one JSON line to a file.

Its program, tools/otlpsink, is its own Go module (the Collector's dependencies stay out
of the library's go.mod); it is built once into ``build/otlpsink`` at the repository root,
like nats-server (about 70 s on a 2-core machine the first time, then cached until its
sources change).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from .nats import _go
from .procs import HANG, ROOT, Proc, wait_until

_SRC = ROOT / "tools" / "otlpsink"
_BIN = ROOT / "build" / "otlpsink"

Span = Dict[str, Any]


def otlpsink_binary() -> Path:
    """The path of the otlpsink binary, built from tools/otlpsink on first use."""
    newest = max(p.stat().st_mtime for p in _SRC.iterdir() if p.is_file())
    if _BIN.exists() and _BIN.stat().st_mtime >= newest:
        return _BIN
    _BIN.parent.mkdir(parents=True, exist_ok=True)
    tmp = _BIN.with_name(f".otlpsink.{os.getpid()}")
    subprocess.run([_go(), "build", "-o", str(tmp), "."], cwd=_SRC, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
    os.replace(tmp, _BIN)
    return _BIN


class OtlpSink(Proc):
    """The receiver: ``endpoint`` is its OTLP/HTTP base URL (for OTEL_EXPORTER_OTLP_ENDPOINT);
    ``spans()`` the spans received so far. It lives until ``stop()`` closes its stdin."""

    def __init__(self, out: Union[str, Path], log_dir: Optional[Union[str, Path]] = None) -> None:
        self.out = Path(out)
        self.out.touch()
        super().__init__("otlpsink", [str(otlpsink_binary()), "-out", str(self.out)], dict(os.environ),
                         log_dir=log_dir, stdin=True, events=True)
        line = self.read_line().strip()
        if not line.startswith("listening http://"):
            self.kill()
            raise self.error(f"printed {line!r}, not its address")
        self.endpoint = line.split(" ", 1)[1]

    def spans(self) -> List[Span]:
        """Every span received so far (each line a whole one: the sink writes them whole)."""
        with open(self.out, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

    def wait_spans(self, cond: Callable[[List[Span]], bool], what: str, timeout: float = HANG) -> List[Span]:
        """The spans, once ``cond`` holds for them."""
        got: List[List[Span]] = []

        def check() -> bool:
            got[:] = [self.spans()]
            return cond(got[0])

        wait_until(check, what, timeout=timeout)
        return got[0]

    def stop(self, timeout: float = 10.0) -> Optional[str]:
        return self.stop_by_stdin(timeout)


def otel_env(endpoint: str, service: str) -> Dict[str, str]:
    """The OTEL_* variables that send a process's spans to ``endpoint`` as ``service``,
    exported every 50 ms (the default 5 s would only slow the tests down)."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }


if __name__ == "__main__":  # build it ahead: python -m harness.otlp
    print(otlpsink_binary(), file=sys.stderr)
