"""Run the scale simulation (go/cmd/scalesim) and put its figures in docs/scale.md.

    python python/benchmarks/scale_sim.py [--workers 10,100,500,1000] [--per-stream]

Runs ``go run ./go/cmd/scalesim -workers ... -json FILE`` from the repository
root (about a minute on 2 CPUs; see the command's own documentation), then

- replaces the part of docs/scale.md between ``<!-- scale-sim:begin -->`` and
  ``<!-- scale-sim:end -->`` with the command, the date, the commit and the
  tables of figures;
- writes docs/scale.svg, the plot the document shows, by hand (no plotting
  library).

With ``--per-stream`` the simulation runs a second time with every response
stream on a connection of its own (``DYNAMO_CTX_STREAM_CONNECTIONS=per-stream``,
docs/request-plane.md section 6.1), and the document gets a table of the
figures that depend on it, both ways side by side (twice the time).
``--rev REV`` runs the committed sources of REV instead of the working tree
(which others may be editing). ``--json FILE`` keeps the results;
``--from-json FILE`` writes the document and the plot from them again
without running anything. Anything after ``--`` is passed to scalesim.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "scale.md"
SVG = ROOT / "docs" / "scale.svg"
BEGIN, END = "<!-- scale-sim:begin -->", "<!-- scale-sim:end -->"

Result = Dict[str, Any]


def simulate(src: Path, workers: str, extra: Sequence[str], env: Optional[Dict[str, str]] = None) -> List[Result]:
    """Runs scalesim in the source tree src and returns its JSON results."""
    with tempfile.TemporaryDirectory(prefix="scalesim-") as tmp:
        out = Path(tmp) / "out.json"
        cmd = ["go", "run", "./go/cmd/scalesim", "-workers", workers, "-json", str(out), "-v", *extra]
        print("+", " ".join(f"{k}={v}" for k, v in (env or {}).items()), " ".join(cmd), f"(in {src})", file=sys.stderr, flush=True)
        code = subprocess.run(cmd, cwd=src, env=dict(os.environ, **(env or {}))).returncode
        if not out.exists():
            sys.exit(f"scalesim failed (exit status {code})")
        # Exit status 1 with results: a phase failed at some point; its
        # figures are missing and its error is in the results.
        return list(json.loads(out.read_text()))


def archive(rev: str, dest: Path) -> None:
    """Unpacks the committed sources of rev into dest."""
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", "archive", rev], cwd=ROOT, stdout=tar, check=True)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as tf:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.12 and recent patch releases
                tf.extractall(dest, filter="data")
            else:
                tf.extractall(dest)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def revision() -> str:
    """The commit, and the Go files changed since, if any."""
    head = git("rev-parse", "--short", "HEAD")
    dirty = sorted({ln[3:].split("/")[1] for ln in git("status", "--porcelain", "--", "go").splitlines()
                    if ln[3:].startswith("go/") and ln[3:].count("/") >= 2})
    if not dirty:
        return f"commit {head}"
    return f"commit {head} with uncommitted changes under " + ", ".join(f"go/{d}" for d in dirty)


# --- tables ---------------------------------------------------------------------------


def fmt(v: float, digits: int = 0) -> str:
    if v < 0:
        return "n/a"
    return f"{v:,.{digits}f}"


def table(head: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def idle(r: Result, now: str, before: str) -> float:
    """A message rate while idle, every subject counted (idle_<now>_per_s), or,
    from results of before discovery by change, discovery's own
    (discovery_<before>_per_period)."""
    if f"idle_{now}_per_s" in r:
        return float(r[f"idle_{now}_per_s"])
    return float(r[f"discovery_{before}_per_period"]) / r["heartbeat_s"]


def tables(rs: List[Result]) -> str:
    nats = table(
        ["workers", "callers", "watchers", "discovery", "idle: published /s", "delivered /s", "node to node /s",
         "idle CPU (of 2)", "request: published", "delivered", "node to node",
         "bytes", "abort confirmation: delivered", "node to node"],
        [[str(r["workers"]), str(r["callers"]), str(r["watchers"]), "by change" if r.get("jetstream") else "by heartbeat",
          fmt(idle(r, "client_pubs", "pubs")), fmt(idle(r, "deliveries", "deliveries")), fmt(idle(r, "route_msgs", "route_msgs")),
          fmt(r["idle_cpus"], 2),
          fmt(r["nats_pubs_per_request"], 2), fmt(r["nats_deliveries_per_request"], 2), fmt(r["nats_route_msgs_per_request"], 2),
          fmt(r["nats_bytes_published_per_request"]), fmt(r["abort_confirmation_deliveries_per_hop"], 1),
          fmt(r["abort_confirmation_route_msgs_per_hop"], 1)] for r in rs])
    conns = table(
        ["workers", "NATS conns per process", "clients per node", "route conns per node", "pairs used (cap per caller)",
         "stream conns per caller: peak", "after", "TIME_WAIT per request", "per stream: KiB", "goroutines", "fds",
         "per connection: KiB", "goroutines", "fds"],
        [[str(r["workers"]), fmt(r["nats_conns_per_process"], 2), "/".join(map(str, r["nats_clients_per_server"])),
          "/".join(map(str, r["nats_route_conns_per_server"])), f'{r["caller_worker_pairs_used"]:,} ({r["workers_per_caller_cap"]})',
          fmt(r["stream_conns_peak_per_caller"]), fmt(r["stream_conns_after_per_caller"]), fmt(r["time_wait_per_request"], 2),
          fmt((r["heap_bytes_per_stream"] + r["stack_bytes_per_stream"]) / 1024, 1), fmt(r["goroutines_per_stream"], 1),
          fmt(r["fds_per_stream"], 1),
          fmt((r["heap_bytes_per_connection"] + r["stack_bytes_per_connection"]) / 1024, 1) if r["conn_pairs_measured"] else "n/a",
          fmt(r["goroutines_per_connection"], 1), fmt(r["fds_per_connection"], 1)] for r in rs])
    times = table(
        ["workers", "requests/s", "p50 ms", "p99 ms", "CPU us per request", "kill hops", "last hop ms: p50", "max",
         "any hop p50 ms", "all confirmations ms", "kill storm: streams", "last handler ms", "all confirmations ms",
         "crash -> dropped s", "request to crashed ms", "drain -> dropped ms", "pick us", "pick bytes"],
        [[str(r["workers"]), fmt(r["requests_per_s"]), fmt(r["request_p50_ms"], 1), fmt(r["request_p99_ms"], 1),
          fmt(r["cpu_us_per_request"]), str(r["kill_hops"]), fmt(r["kill_last_hop_p50_ms"], 1), fmt(r["kill_last_hop_max_ms"], 1),
          fmt(r["kill_hop_p50_ms"], 1), fmt(r["abort_confirmations_all_callers_p50_ms"], 1), str(r["storm_streams"]),
          fmt(r["storm_last_handler_ms"], 1), fmt(r["storm_confirmations_all_callers_ms"], 1),
          f'{r["crash_converge_min_s"]:.2f}-{r["crash_converge_max_s"]:.2f}',
          f'{r["request_to_crashed_ms"]:.1f} ({r["request_to_crashed_error"]})', fmt(r["drain_converge_max_ms"], 1),
          fmt(r["instances_snapshot_us"], 2), fmt(r["instances_snapshot_bytes"])] for r in rs])
    parts = ["**NATS traffic** (idle: every message a second, discovery's and the rest; per request; per hop killed):", nats,
             "**Connections and memory** (memory: Go heap and stacks, both ends of each stream or connection):", conns,
             "**Latencies and convergence**:", times]
    fe = [r for r in rs if "frontend_cpu_us_per_request" in r]
    if fe:
        parts += ["**The frontend in front of the fleet** (a real `go/frontend` routing 2-token completions from 8 "
                  "keep-alive clients to the workers; per request, the process's CPU and allocations less their idle "
                  "rates; ratio: to the smallest fleet's):", frontend_table(fe)]
    errors = [f'{r["workers"]} workers: {e}' for r in rs for e in r.get("errors") or []]
    if errors:
        parts.append("Phases that failed (their figures are missing or partial):\n\n" + "\n".join(f"- {e}" for e in errors))
    return "\n\n".join(parts)


def frontend_table(rs: List[Result]) -> str:
    first = rs[0]
    return table(
        ["workers", "requests/s", "CPU us per request", "ratio", "allocations per request", "ratio", "bytes per request",
         "idle CPU (of 2)"],
        [[str(r["workers"]), fmt(r["frontend_requests_per_s"]), fmt(r["frontend_cpu_us_per_request"]),
          fmt(r["frontend_cpu_us_per_request"] / first["frontend_cpu_us_per_request"], 2),
          fmt(r["frontend_allocs_per_request"]),
          fmt(r["frontend_allocs_per_request"] / first["frontend_allocs_per_request"], 2),
          fmt(r["frontend_bytes_per_request"]), fmt(r["frontend_idle_cpus"], 2)] for r in rs])


def comparison(base: List[Result], this: List[Result]) -> str:
    rows = []
    for b, t in zip(base, this):
        for label, r in (("per stream", b), ("sessions", t)):
            rows.append([str(r["workers"]), label, fmt(r["stream_conns_peak_per_caller"]), fmt(r["stream_conns_after_per_caller"]),
                         fmt(r["time_wait_per_request"], 2), fmt((r["heap_bytes_per_stream"] + r["stack_bytes_per_stream"]) / 1024, 1),
                         fmt(r["fds_per_stream"], 1), fmt(r["requests_per_s"]), fmt(r["cpu_us_per_request"]),
                         fmt(r["kill_last_hop_p50_ms"], 1), fmt(r["storm_last_handler_ms"], 1)])
    return table(["workers", "connections", "stream conns per caller: peak", "after", "TIME_WAIT per request", "KiB per stream",
                  "fds per stream", "requests/s", "CPU us per request", "kill last hop p50 ms", "kill storm last handler ms"], rows)


def update_doc(body: str) -> None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"{DOC}: the markers {BEGIN} and {END} are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + BEGIN + "\n" + body.strip() + "\n" + END + tail)


# --- the plot ---------------------------------------------------------------------------

Series = Tuple[str, str, List[Tuple[float, float]]]  # name, colour, points


class Panel:
    """One chart: a log x axis (workers), a linear or log y axis."""

    W, H, LEFT, RIGHT, TOP, BOTTOM = 330, 230, 58, 22, 30, 40

    def __init__(self, title: str, ylabel: str, series: List[Series], ylog: bool = False,
                 bands: Optional[List[Tuple[str, float, float]]] = None, xlabel: str = "workers", headroom: float = 1.1) -> None:
        """headroom: room above the data for the legend, a factor of the top (a log axis rounds it up to a decade)."""
        self.title, self.ylabel, self.series, self.ylog, self.xlabel = title, ylabel, series, ylog, xlabel
        self.bands, self.headroom = bands or [], headroom

    def svg(self, x0: float, y0: float) -> str:
        xs = [x for _, _, pts in self.series for x, _ in pts]
        ys = [y for _, _, pts in self.series for _, y in pts if y > 0 or not self.ylog]
        ys += [v for _, lo, hi in self.bands for v in (lo, hi)]
        xlo, xhi = 10 ** math.floor(math.log10(min(xs))), 10 ** math.ceil(math.log10(max(xs)))
        if self.ylog:
            ylo, yhi = 10 ** math.floor(math.log10(min(ys))), 10 ** math.ceil(math.log10(max(ys) * self.headroom))
            yticks = [10 ** e for e in range(int(math.log10(ylo)), int(math.log10(yhi)) + 1)]
        else:
            ylo, yhi, yticks = nice(0.0, max(ys) * self.headroom)
        pw, ph = self.W - self.LEFT - self.RIGHT, self.H - self.TOP - self.BOTTOM
        px0, py0 = x0 + self.LEFT, y0 + self.TOP

        def sx(x: float) -> float:
            return px0 + pw * (math.log10(x) - math.log10(xlo)) / (math.log10(xhi) - math.log10(xlo))

        def sy(y: float) -> float:
            if self.ylog:
                f = (math.log10(max(y, ylo)) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo))
            else:
                f = (y - ylo) / (yhi - ylo)
            return py0 + ph * (1 - f)

        out = [f'<text x="{x0 + self.W / 2:.1f}" y="{y0 + 18:.1f}" text-anchor="middle" font-weight="bold">{esc(self.title)}</text>',
               f'<rect x="{px0:.1f}" y="{py0:.1f}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
        for name, lo, hi in self.bands:
            out.append(f'<rect x="{px0:.1f}" y="{sy(hi):.1f}" width="{pw}" height="{sy(lo) - sy(hi):.1f}" fill="#eee"/>')
            out.append(f'<text x="{px0 + pw - 4:.1f}" y="{sy(lo) - 4:.1f}" text-anchor="end" fill="#777" font-size="10">'
                       f'{esc(name)}</text>')
        e = int(math.log10(xlo))
        while 10 ** e <= xhi:
            x = sx(10 ** e)
            out.append(f'<line x1="{x:.1f}" y1="{py0 + ph:.1f}" x2="{x:.1f}" y2="{py0 + ph + 4:.1f}" stroke="#888"/>')
            out.append(f'<text x="{x:.1f}" y="{py0 + ph + 15:.1f}" text-anchor="middle">{10 ** e:,}</text>')
            e += 1
        for t in yticks:
            y = sy(t)
            out.append(f'<line x1="{px0:.1f}" y1="{y:.1f}" x2="{px0 + pw:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{px0 - 4:.1f}" y="{y + 4:.1f}" text-anchor="end">{short(t)}</text>')
        out.append(f'<text x="{px0 + pw / 2:.1f}" y="{py0 + ph + 30:.1f}" text-anchor="middle" fill="#555">{esc(self.xlabel)}</text>')
        out.append(f'<text transform="translate({x0 + 12:.1f},{py0 + ph / 2:.1f}) rotate(-90)" text-anchor="middle" '
                   f'fill="#555">{esc(self.ylabel)}</text>')
        for i, (name, colour, pts) in enumerate(self.series):
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>' for x, y in pts]
            ly = py0 + 12 + 13 * i
            out.append(f'<line x1="{px0 + 6:.1f}" y1="{ly - 4:.1f}" x2="{px0 + 20:.1f}" y2="{ly - 4:.1f}" '
                       f'stroke="{colour}" stroke-width="2"/>')
            out.append(f'<text x="{px0 + 24:.1f}" y="{ly:.1f}" font-size="10">{esc(name)}</text>')
        return "\n".join(out)


def esc(s: str) -> str:
    return html.escape(s, quote=True)


def nice(lo: float, hi: float) -> Tuple[float, float, List[float]]:
    """A range from lo covering hi, and 4 or 5 round ticks."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    top = math.ceil(hi / step) * step
    n = int(round((top - lo) / step))
    return lo, top, [lo + k * step for k in range(n + 1)]


def short(v: float) -> str:
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:g}"


def plot(rs: List[Result], path: Path, caption: str) -> None:
    def pts(f: Callable[[Result], float]) -> List[Tuple[float, float]]:
        return [(float(r["workers"]), f(r)) for r in rs]

    hb = rs[0]["heartbeat_s"]
    ttl = rs[0]["ttl_s"]
    panels = [
        Panel("NATS traffic while idle", "messages / s", [
            ("delivered to clients", "#d62728", pts(lambda r: idle(r, "deliveries", "deliveries"))),
            ("published by clients", "#1f77b4", pts(lambda r: idle(r, "client_pubs", "pubs"))),
            ("copies between nodes", "#2ca02c", pts(lambda r: idle(r, "route_msgs", "route_msgs"))),
        ], ylog=True),
        Panel("NATS messages per request", "messages", [
            ("published + delivered", "#1f77b4", pts(lambda r: r["nats_pubs_per_request"] + r["nats_deliveries_per_request"])),
            ("copies between nodes", "#2ca02c", pts(lambda r: r["nats_route_msgs_per_request"])),
            ("abort confirmation deliveries / hop", "#d62728", pts(lambda r: r["abort_confirmation_deliveries_per_hop"])),
        ], ylog=True, headroom=3),
        Panel("Kill fan-out (one hop per worker)", "ms after the kill", [
            ("last hop saw the kill (p50)", "#1f77b4", pts(lambda r: r["kill_last_hop_p50_ms"])),
            ("every caller had every confirmation", "#d62728", pts(lambda r: r["abort_confirmations_all_callers_p50_ms"])),
        ], ylog=True, headroom=3),
        Panel("Crashed worker dropped by every client", "s after the crash", [
            ("latest", "#d62728", pts(lambda r: r["crash_converge_max_s"])),
            ("earliest", "#1f77b4", pts(lambda r: r["crash_converge_min_s"])),
        ], bands=[(f"bound: {ttl - hb:g} to {ttl * 1.25:g} s", ttl - hb, ttl * 1.25)]),
        Panel("Memory (both ends)", "KiB", [
            ("per connection", "#d62728", [(x, y) for x, y in pts(
                lambda r: (r["heap_bytes_per_connection"] + r["stack_bytes_per_connection"]) / 1024
                if r["conn_pairs_measured"] else -1) if y >= 0]),
            ("per stream", "#1f77b4", pts(lambda r: (r["heap_bytes_per_stream"] + r["stack_bytes_per_stream"]) / 1024)),
        ], headroom=1.5),
        Panel("Picking an instance per request", "us (Client.Reserve)", [
            ("one pick", "#1f77b4", pts(lambda r: r["instances_snapshot_us"])),
        ], ylog=True),
    ]
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    width, height = cols * Panel.W, rows * Panel.H + 24
    body = [p.svg((i % cols) * Panel.W, (i // cols) * Panel.H) for i, p in enumerate(panels)]
    body.append(f'<text x="8" y="{height - 8}" fill="#555" font-size="10">{esc(caption)}</text>')
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="sans-serif" font-size="11">\n<rect width="100%" height="100%" fill="white"/>\n'
        + "\n".join(body) + "\n</svg>\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="10,100,500,1000", help="numbers of workers, comma-separated")
    ap.add_argument("--per-stream", action="store_true", help="also run with a connection per stream, and compare")
    ap.add_argument("--no-doc", action="store_true", help="print the tables only; leave docs/ alone")
    ap.add_argument("--rev", metavar="REV", help="run the committed sources of REV (git archive), not the working tree")
    ap.add_argument("--json", metavar="FILE", help="also write the results (and when, where, how) to FILE")
    ap.add_argument("--from-json", metavar="FILE", help="run nothing: write the document and plot from a file of --json")
    ap.add_argument("extra", nargs="*", help="arguments passed to scalesim (after --)")
    args = ap.parse_args()

    if args.from_json:
        run = json.loads(Path(args.from_json).read_text())
    else:
        command = "python python/benchmarks/scale_sim.py --workers " + args.workers
        if args.per_stream:
            command += " --per-stream"
        if args.rev:
            command += " --rev " + args.rev
        if args.extra:
            command += " -- " + " ".join(args.extra)
        with tempfile.TemporaryDirectory(prefix="scalesim-src-") as tmp:
            src, rev = ROOT, revision()
            if args.rev:
                src, rev = Path(tmp), "commit " + git("rev-parse", "--short", args.rev)
                archive(args.rev, src)
            run = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "rev": rev,
                   "cpus": os.cpu_count(), "command": command, "sessions": simulate(src, args.workers, args.extra)}
            if args.per_stream:
                run["per_stream"] = simulate(src, args.workers, args.extra, {"DYNAMO_CTX_STREAM_CONNECTIONS": "per-stream"})
        if args.json:
            Path(args.json).write_text(json.dumps(run, indent=1) + "\n")
    this: List[Result] = run["sessions"]
    body = [f'Measured on {run["date"]} ({run["rev"]}; {run["cpus"]} CPUs, shared with other work) with:', "", "```sh",
            run["command"], "```", "", tables(this)]
    base: Optional[List[Result]] = run.get("per_stream")
    if base:
        body += ["", "**Sessions beside a connection per stream** (the same simulation with "
                 "`DYNAMO_CTX_STREAM_CONNECTIONS=per-stream`):", "", comparison(base, this)]
        errors = [f'{r["workers"]} workers: {e}' for r in base for e in r.get("errors") or []]
        if errors:
            body += ["", "Phases that failed with a connection per stream:", ""] + [f"- {e}" for e in errors]
    text = "\n".join(body)
    print(text)
    if not args.no_doc:
        update_doc(text)
        plot(this, SVG, f'scalesim, {run["date"]}, {run["rev"]}: 3 NATS nodes, workers and callers (1 per 10 workers) '
                        "in one process on this machine")
        print(f"wrote {DOC.relative_to(ROOT)} and {SVG.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
