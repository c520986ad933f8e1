"""Fault-tolerance figures: runs the process-level fault tests (64 concurrent streams
through the frontend, migration limit 2, three mock workers) ``--runs`` times and
summarises what they print: streams completed token-exact, time from the fault to the
next successful request, and the longest gap any stream saw (for a SIGSTOPped worker,
the time to detect the stall and resume the stream elsewhere).

    .venv/bin/python python/benchmarks/bench_faults.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "tests"))  # the harness
from harness import child_env, run_python  # noqa: E402

TESTS = ["python/tests/fault_tolerance/test_ft_faults_mid_stream.py", "python/tests/fault_tolerance/test_ft_cluster.py"]
LINE = re.compile(r"(?P<label>(?:SIGKILL|SIGSTOP|cluster)[^:]*): (?P<ok>\d+)/(?P<n>\d+) streams complete token-exact; "
                  r"(?:\S+ )+-> next success (?P<rec>\d+) ms; longest gap in a stream (?P<gap>\d+) ms")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    data = defaultdict(list)
    failed = 0
    for _ in range(args.runs):
        p = run_python("-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *TESTS,
                       env=child_env(os.environ.get("NATS_SERVER")), cwd=ROOT, timeout=None)
        failed += p.returncode != 0
        for line in p.stdout.splitlines():
            m = LINE.search(line)
            if m:
                data[m["label"]].append((int(m["ok"]), int(m["n"]), int(m["rec"]), int(m["gap"])))
    for label, rows in data.items():
        ok = sum(r[0] for r in rows)
        n = sum(r[1] for r in rows)
        rec = sorted(r[2] for r in rows)
        gap = sorted(r[3] for r in rows)
        print(f"{label}: {ok}/{n} streams token-exact over {len(rows)} runs ({100.0 * ok / n:.1f}%); "
              f"fault -> next success {rec[0]}-{rec[-1]} ms (median {rec[len(rec) // 2]}); "
              f"longest stream gap {gap[0]}-{gap[-1]} ms")
    if failed:
        print(f"{failed} of {args.runs} runs had a failing test")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
