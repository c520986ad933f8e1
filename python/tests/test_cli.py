"""The commands as a user meets them: every failure is one line on
stderr with exit status 2 (bad arguments) or 1 (run time); --help is plain
text with defaults; the worker answers /metrics and /health from start-up;
handler errors are logged on the worker; JSON-lines logs.

Each command runs as a process; nothing here uses a fixed port or 4222.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from dynamo_ctx import DistributedRuntime, HandlerError
from dynamo_ctx.cli import _args, _errors, _logging, _runner
from harness import HANG, Worker, child_env, http_get, new_namespace, run_python, wait_until

WORKER = "python -m dynamo_ctx.worker"
FRONTEND = "python -m dynamo_ctx.frontend"
DEMO = "python -m dynamo_ctx.demo"
MODULES = {WORKER: "dynamo_ctx.worker", FRONTEND: "dynamo_ctx.frontend", DEMO: "dynamo_ctx.demo"}


def env_for(**extra: str) -> dict:
    """A command's environment: the harness's (the in-tree package first)
    without this process's DYN* settings, help on long lines (so that phrases
    stay whole) and, unless ``extra`` says otherwise, a NATS_SERVER where no
    server ever runs: these runs must not reach one."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("DYN")}
    return child_env("nats://127.0.0.1:1", base=base, COLUMNS="200", **extra)


def run_cmd(prog: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return run_python("-m", MODULES[prog], *args, env=env_for(**env))


def one_line(r: subprocess.CompletedProcess, prog: str) -> str:
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(prog + ": "), lines[0]
    assert "Traceback" not in r.stderr and "(code" not in r.stderr
    return lines[0]


def held_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize(
    "prog,args,env,expected",
    [
        (WORKER, ["--metrics-port", "99999"], {}, "argument --metrics-port: 99999 is not a port (0 to 65535)"),
        (WORKER, ["--log-level", "foo"], {}, "argument --log-level: 'foo' is not a log level"),
        (WORKER, ["--migration-limit", "-5"], {}, "argument --migration-limit: -5 is negative"),
        (WORKER, ["--mode", "both"], {}, "argument --mode: 'both' is not one of agg, prefill, decode"),
        (WORKER, ["--metrics-read-timeout", "0"], {}, "argument --metrics-read-timeout: 0 is not positive"),
        (WORKER, ["--log-format", "xml"], {}, "argument --log-format: 'xml' is not a log format"),
        (WORKER, [], {"DYN_SYSTEM_PORT": "x"}, "DYN_SYSTEM_PORT='x': 'x' is not a whole number"),
        (WORKER, [], {"DYN_LOG": "loud"}, "DYN_LOG='loud': 'loud' is not a log level"),
        (WORKER, ["--bogus"], {}, "unrecognized arguments: --bogus"),
        (WORKER, ["--event-loop", "trio"], {}, "argument --event-loop: 'trio' is not one of auto, uvloop, asyncio"),
        (FRONTEND, [], {"DYNAMO_CTX_EVENT_LOOP": "x"}, "DYNAMO_CTX_EVENT_LOOP='x': 'x' is not one of auto, uvloop, asyncio"),
        (FRONTEND, ["--http-port", "-1"], {}, "argument --http-port: -1 is not a port"),
        (FRONTEND, ["--migration-limit", "-5"], {}, "argument --migration-limit: -5 is negative"),
        (FRONTEND, [], {"DYN_HTTP_PORT": "70000"}, "DYN_HTTP_PORT='70000': 70000 is not a port"),
        (FRONTEND, ["--max-body-bytes", ""], {}, "argument --max-body-bytes: expected a value"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(prog, args, env, expected):
    r = run_cmd(prog, *args, **env)
    assert r.returncode == 2, r.stderr
    line = one_line(r, prog)
    assert expected in line and line.endswith(f"see {prog} --help"), line


@pytest.mark.parametrize(
    "args,env,expected",
    [
        (["--max-body-bytes", "0"], {}, '--max-body-bytes "0": want a positive number of bytes'),
        (["--max-idle-connections", "0"], {}, '--max-idle-connections "0": want a positive number of connections'),
        (["--request-timeout", "-1"], {}, '--request-timeout "-1": timeout is negative'),
        (["--max-queued-requests", "many"], {}, '--max-queued-requests "many": want a number of requests from 0 (no queue)'),
        ([], {"DYNAMO_CTX_REQUEST_TIMEOUT": "soon"}, 'DYNAMO_CTX_REQUEST_TIMEOUT="soon": "soon" is not a number'),
        ([], {"DYNAMO_CTX_MAX_BODY_BYTES": "lots"}, 'DYNAMO_CTX_MAX_BODY_BYTES="lots": want a positive number of bytes'),
        (["--max-body-bytes", "7"], {"DYNAMO_CTX_MAX_QUEUED_REQUESTS": "-1"}, 'DYNAMO_CTX_MAX_QUEUED_REQUESTS="-1"'),
    ],
)
def test_bad_frontend_settings_exit_2_with_one_line(args, env, expected):
    """The frontend's settings that the library reads (their flags handed on
    through their variables) are checked by the library, the one parser,
    before the command connects (NATS_SERVER here is never a server): a bad
    one, from a flag or a variable, is a usage error that names it."""
    r = run_cmd(FRONTEND, "--http-host", "127.0.0.1", "--http-port", "0", *args, **env)
    assert r.returncode == 2, r.stderr
    line = one_line(r, FRONTEND)
    assert expected in line and line.endswith(f"see {FRONTEND} --help"), line


def test_out_of_range_values_are_refused_by_the_librarys_one_range():
    """A value past its range is a usage error whose reason is the library's,
    from the one statement of the range (Go's): the timeout range
    (go/ctxtree, ``_native.MAX_TIMEOUT_SECONDS``) for --request-timeout,
    which the library parses, and --drain-timeout, which it checks, from a
    flag or a variable; the queue bound's for --max-queued-requests. The
    command restates neither the bound nor the message: each line is what
    the library says of the same value, and the last value in range passes
    the library's check."""
    from dynamo_ctx._lib import native
    from dynamo_ctx.cli.frontend import FrontendSettings, Given

    lib = native()
    year = lib.MAX_TIMEOUT_SECONDS
    lib.timeout_check(float(year - 1))
    with pytest.raises(ValueError) as e:
        lib.timeout_check(float(year))
    too_long = _errors.native_reason(e.value)
    assert str(year - 1) in too_long, too_long

    def library_says(field: str, text: str, source: str) -> str:
        settings = FrontendSettings("127.0.0.1:0", **{field: Given(text, source)}).to_json()
        with pytest.raises(ValueError) as e:
            lib.frontend_check_settings(settings)
        return _errors.native_reason(e.value)

    assert library_says("request_timeout", str(year), "--request-timeout") == f'--request-timeout "{year}": {too_long}'
    lib.frontend_check_settings(FrontendSettings("127.0.0.1:0", max_queued_requests=Given("1048576", "x")).to_json())
    cases = [
        (["--request-timeout", str(year)], {}, library_says("request_timeout", str(year), "--request-timeout")),
        ([], {"DYNAMO_CTX_REQUEST_TIMEOUT": str(year)},
         library_says("request_timeout", str(year), "DYNAMO_CTX_REQUEST_TIMEOUT")),
        (["--max-queued-requests", "1048577"], {}, library_says("max_queued_requests", "1048577", "--max-queued-requests")),
        (["--drain-timeout", str(year)], {}, f"argument --drain-timeout: {too_long}"),
        ([], {"DYNAMO_CTX_DRAIN_TIMEOUT": str(year)}, f"DYNAMO_CTX_DRAIN_TIMEOUT='{year}': {too_long}"),
    ]
    for args, env, expected in cases:
        r = run_cmd(FRONTEND, "--http-host", "127.0.0.1", "--http-port", "0", *args, **env)
        assert r.returncode == 2, r.stderr
        line = one_line(r, FRONTEND)
        assert line == f"{FRONTEND}: {expected}; see {FRONTEND} --help", line


def test_a_library_loaded_while_reading_arguments_gets_the_log_level(monkeypatch):
    """The frontend's --drain-timeout is checked by the library as it is read,
    which loads it with the level of then; setup_logging tells it the
    command's level."""
    from dynamo_ctx import _lib
    from dynamo_ctx.cli.frontend import parse_args

    assert parse_args(["--drain-timeout", "2.5"]).drain_timeout == 2.5
    assert _lib.loaded()
    levels = []
    monkeypatch.setattr(_lib, "set_native_log_level", levels.append)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        _logging.setup_logging("debug", "text")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
    assert levels == [logging.DEBUG]


def test_event_loop_choice(monkeypatch):
    """--event-loop: asyncio's own loop when asked; uvloop when asked or, with
    auto, when it is installed; asked for but missing, a usage error (exit 2)."""
    assert _runner.loop_runner("asyncio") is asyncio.run
    try:
        import uvloop
    except ImportError:
        pass
    else:
        assert _runner.loop_runner("auto") is uvloop.run
        assert _runner.loop_runner("uvloop") is uvloop.run
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    assert _runner.loop_runner("auto") is asyncio.run
    with pytest.raises(_errors.UsageError, match="uvloop is not installed"):
        _runner.loop_runner("uvloop")


def test_engine_vllm_without_vllm_exits_2():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    r = run_cmd(WORKER, "--engine", "vllm")
    assert r.returncode == 2
    assert "--engine vllm needs vLLM, which is not installed here; install vllm or use --engine mock" in one_line(r, WORKER)


@pytest.mark.parametrize("prog", [WORKER, FRONTEND])
def test_help_is_plain_text_with_defaults_and_env_vars(prog):
    r = run_cmd(prog, "--help")
    assert r.returncode == 0 and r.stderr == ""
    assert "``" not in r.stdout and ":class:" not in r.stdout
    assert "(env DYN_LOG; default: info)" in r.stdout
    assert "DYN_LOGGING_JSONL" in r.stdout and "DYN_NAMESPACE; default: dynamo" in r.stdout
    if prog == FRONTEND:
        assert "(env DYN_HTTP_PORT; default: 8000)" in r.stdout
    else:
        assert "(env DYN_SYSTEM_PORT)" in r.stdout and "(env DYN_MIGRATION_LIMIT; default: 0)" in r.stdout


def test_unreachable_nats_exits_1_with_one_line():
    for prog in (WORKER, FRONTEND, DEMO):
        r = run_cmd(prog, "--http-port", "0") if prog == FRONTEND else run_cmd(prog)
        assert r.returncode == 1, r.stderr
        line = one_line(r, prog)
        assert "cannot reach NATS at nats://127.0.0.1:1" in line and "set NATS_SERVER" in line, line


def test_port_in_use_exits_1_with_one_line(nats_url):
    with held_port() as s:
        port = s.getsockname()[1]
        r = run_cmd(FRONTEND, "--http-host", "127.0.0.1", "--http-port", str(port), NATS_SERVER=nats_url)
        assert r.returncode == 1, r.stderr
        assert one_line(r, FRONTEND) == f"{FRONTEND}: port {port} is in use; choose another with --http-port"
        r = run_cmd(WORKER, "--metrics-port", str(port), NATS_SERVER=nats_url)
        assert r.returncode == 1, r.stderr
        assert one_line(r, WORKER) == f"{WORKER}: port {port} is in use; choose another with --metrics-port"


def test_native_error_code_is_an_attribute_not_text():
    with pytest.raises(RuntimeError) as ei:
        DistributedRuntime(nats_url="nats://127.0.0.1:1")
    assert (ei.value.code_name, type(ei.value.code)) == ("ECONNECT", int)
    assert "(code" not in str(ei.value)


def get(url: str, method: str = "GET"):
    return http_get(url, method=method)


def poll(fn, what: str):
    return wait_until(fn, what, every=0.05)


def test_decode_worker_answers_before_a_prefill_worker_exists(nats_url):
    """/metrics and /health answer at once; /health says what it waits for
    (503, JSON) until a prefill worker comes, then 200; HEAD works; the logs are JSON lines."""
    ns = new_namespace("cli")
    # The command as a user runs it: no --engine, --model or --log-level of the harness's.
    decode = Worker("decode", env_for(NATS_SERVER=nats_url, DYN_LOGGING_JSONL="1"), namespace=ns, mode="decode",
                    model=None, engine=None)
    base = decode.metrics_url
    status, headers, body = poll(lambda: get(f"{base}/health"), "the decode worker's /health")
    assert status == 503 and headers["Content-Type"] == "application/json", (status, body)
    poll(lambda: json.loads(get(f"{base}/health")[2]).get("waiting_for", "").startswith("a prefill worker"), "waiting_for")
    assert json.loads(get(f"{base}/health")[2]) == {
        "status": "waiting",
        "waiting_for": f"a prefill worker on {ns}.prefill.generate",
    }
    status, headers, body = get(f"{base}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    text = body.decode()
    assert 'dynamo_ctx_worker_requests_total{model="mock-model"} 0.0' in text
    assert "process_cpu_seconds_total" in text or "python_info" in text  # the default registry is served too
    status, headers, body = get(f"{base}/metrics", "HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0
    assert get(f"{base}/nope")[0] == 404
    assert get(f"{base}/metrics", "POST")[0] == 405

    Worker("prefill", env_for(NATS_SERVER=nats_url), namespace=ns, mode="prefill", model=None, engine=None)
    poll(lambda: get(f"{base}/health")[0] == 200, "readiness after the prefill worker came")
    assert json.loads(get(f"{base}/health")[2]) == {"status": "ready"}
    assert decode.stop(timeout=HANG) is None
    decode.wait()
    records = [json.loads(line) for line in decode.lines]
    assert all({"time", "level", "target", "message"} <= set(r) for r in records), decode.log()
    assert any(r["message"].startswith("serving ") and r["level"] == "INFO" for r in records), decode.log()


def test_a_fresh_worker_exports_every_metric_family_at_zero(nats_url):
    """Before any request, the worker's /metrics has each of its families with its model,
    and each labelled family every known label value at 0: every reason a context can be
    cancelled with (the library's names) and every outcome. A dashboard or an alert sees 0,
    not "no data"."""
    from prometheus_client.parser import text_string_to_metric_families

    from dynamo_ctx._lib import native
    from dynamo_ctx.backends.metrics import OUTCOMES

    reasons = {name for name in native().REASON_NAMES if name}
    assert {"client_disconnected", "deadline", "shutdown"} <= reasons
    with Worker("fresh", env_for(NATS_SERVER=nats_url), namespace=new_namespace("cli"), model="fresh-model") as w:
        w.ready()
        status, _, body = get(f"{w.metrics_url}/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name.startswith("dynamo_ctx_worker_") and not s.name.endswith("_created"):
                samples.setdefault(s.name, {})[tuple(sorted((k, v) for k, v in s.labels.items() if k != "model"))] = s.value
                assert s.labels["model"] == "fresh-model", s
    model_only = ("dynamo_ctx_worker_running_requests", "dynamo_ctx_worker_kv_blocks_in_use", "dynamo_ctx_worker_requests_total",
                  "dynamo_ctx_worker_running_requests_peak", "dynamo_ctx_worker_busy_refusals_total",
                  "dynamo_ctx_worker_library_sent_tokens_total", "dynamo_ctx_worker_library_aborts_total")
    by_reason = ("dynamo_ctx_worker_cancellations_received_total", "dynamo_ctx_worker_aborts_confirmed_total",
                 "dynamo_ctx_worker_abort_freed_kv_blocks_total")
    assert set(samples) == {*model_only, *by_reason, "dynamo_ctx_worker_outcomes_total"}, sorted(samples)
    for name in model_only:
        assert samples[name] == {(): 0.0}, name
    for name in by_reason:
        assert samples[name] == {(("reason", r),): 0.0 for r in reasons}, name
    assert samples["dynamo_ctx_worker_outcomes_total"] == {(("outcome", o),): 0.0 for o in OUTCOMES}


def test_handler_error_is_logged_once_with_request_id_and_traceback(nats_url, caplog):
    async def handler(request):
        yield {"ok": 1}
        raise RuntimeError("engine exploded")

    async def main():
        rt = DistributedRuntime(nats_url=nats_url)
        ep = rt.endpoint(f"{new_namespace('cli')}.backend.generate")
        task = asyncio.ensure_future(ep.serve_endpoint(handler))
        await ep.serving()
        client = await ep.client()
        await client.wait_for_instances()
        stream = await client.generate({})
        rid = stream.context().id()
        with pytest.raises(HandlerError) as ei:
            async for _ in stream:
                pass
        rt.shutdown()
        await asyncio.wait_for(task, HANG)
        return rid, ei.value

    with caplog.at_level(logging.ERROR, logger="dynamo_ctx"):
        rid, err = asyncio.run(asyncio.wait_for(main(), HANG))
    assert str(err).endswith("RuntimeError: engine exploded")  # what the caller sees is unchanged
    records = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "dynamo_ctx"]
    assert len(records) == 1, records
    r = records[0]
    assert r.request_id == rid and rid in r.getMessage() and "engine exploded" in r.getMessage()
    assert r.exc_info is not None and r.exc_info[0] is RuntimeError
    assert re.search(r"in handler\n", logging.Formatter().formatException(r.exc_info))


def test_nats_address_held_by_something_else_fails_fast_with_a_hint():
    """A port that accepts connections but does not speak NATS (as a busy 4222
    can be): one line naming it and NATS_SERVER, well before the 18 s of old."""
    with held_port() as s:
        port = s.getsockname()[1]
        t0 = time.monotonic()
        r = run_cmd(WORKER, NATS_SERVER=f"nats://127.0.0.1:{port}")
        elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    line = one_line(r, WORKER)
    assert f"cannot reach NATS at nats://127.0.0.1:{port}" in line and "set NATS_SERVER" in line, line
    assert elapsed < 15, elapsed  # a hang bound on a loaded machine; about 3 s here


def test_log_level_accepts_dynamo_forms_and_json_lines_carry_request_id_and_traceback():
    assert [_args.log_level(t) for t in ("DEBUG", "warn", "info,dynamo_runtime=debug")] == ["debug", "warning", "info"]
    for bad in ("foo", "info,debug", "", "info,x=loud", "info,=debug"):
        with pytest.raises(Exception, match="not a log level"):
            _args.log_level(bad)
    assert _args.log_levels("Info, dynamo_ctx.backends.vllm=DEBUG,a.b=warn") == (
        "info", {"dynamo_ctx.backends.vllm": "debug", "a.b": "warning"})
    assert _args.log_spec(" WARN ,x=debug") == "warning,x=debug"
    try:
        raise RuntimeError("engine exploded")
    except RuntimeError:
        record = logging.LogRecord("dynamo_ctx", logging.ERROR, __file__, 1, "request %s: boom", ("r-1",), sys.exc_info())
    record.request_id = "r-1"
    line = _logging.JsonFormatter().format(record)
    assert "\n" not in line
    out = json.loads(line)
    assert (out["level"], out["target"], out["message"], out["request_id"]) == ("ERROR", "dynamo_ctx", "request r-1: boom", "r-1")
    assert out["exception"].startswith("Traceback") and out["exception"].endswith("RuntimeError: engine exploded")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", out["time"])


def test_health_says_why_after_engine_death():
    """/health: 200 ready, 503 waiting (with what for), 503 error with the reason once the engine died."""
    from dynamo_ctx.cli.worker import Readiness

    r = Readiness("NATS at x")
    status, body = r.render()
    assert status.startswith("503") and json.loads(body) == {"status": "waiting", "waiting_for": "NATS at x"}
    r.waiting_for = None
    assert r.render()[0] == "200 OK"
    r.failed = "the engine died: EngineDeadError: gone"
    status, body = r.render()
    assert status.startswith("503") and json.loads(body) == {"status": "error", "reason": "the engine died: EngineDeadError: gone"}
