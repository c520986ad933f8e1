"""A worker process: ``python -m dynamo_ctx.worker --engine mock --mode agg --model NAME``.

Serves a vLLM-style handler over the mock engine (or vLLM's ``AsyncLLM`` with
``--engine vllm`` when vLLM is installed) on the request plane, registers the model
with its migration limit, and exposes Prometheus metrics at ``/metrics`` and its
readiness at ``/health`` on ``--metrics-port``: the port is bound at start-up, and
the library's status listener (``dynamo_ctx.status``, the frontend's listener code)
answers it once the engine is made (the library loads after the engine, which may
fork), before the worker waits for NATS or a prefill worker. Modes: ``agg`` (prefill and decode),
``prefill``, ``decode`` (calls a prefill worker first). Endpoints:
``<namespace>.backend.generate`` for agg and decode, ``<namespace>.prefill.generate``
for prefill.

- ``--model`` is a model name or a model directory in the Hugging Face layout; the
  instance publishes the directory (``model_path``, with the checksum of its text files,
  in its model card: ``model_card``) so that the frontend speaks the model's text, and
  ``--served-model-name`` (as vLLM's) names it to clients. The mock
  engine then produces the model's vocabulary, and the context length is its
  config.json's unless ``--max-model-len`` says otherwise.
- With ``--engine vllm`` the engine arguments are vLLM's, as ``vllm serve`` spells
  them, parsed by vLLM's own parser (``--help`` lists them when vLLM is installed).
- An engine that dies (vLLM's ``EngineDeadError``, or ``errored``) turns ``/health``
  to 503 with the reason, is logged once, ends the streams in flight without their
  final marker (so migration continues them on another worker) and makes the worker
  exit with status 1, so that an orchestrator restarts it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import logging
import os
import signal
import socket
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import DistributedRuntime
from .. import status as _status
from .._lib import native
from ..backends import model_dir
from ..backends.metrics import WorkerMetrics
from ..backends.engineload import LoadSink, vllm_stat_logger
from ..backends.mocker import DEFAULT_MAX_NUM_BATCHED_TOKENS, MockAsyncLLM, MockEngineArgs
from ..backends.vllm_outputs import EngineOutputs
from ..backends.vllm import AggregatedHandler, BaseWorkerHandler, DecodeHandler, PrefillHandler
from . import _args, _errors, _logging, _runner
from . import reaper

logger = logging.getLogger("dynamo_ctx.worker")

DESCRIPTION = """\
Serve a vLLM-style handler over an engine on the request plane.

Modes: agg (prefill and decode in one worker), prefill, decode (calls a
prefill worker first). With --metrics-port, Prometheus metrics are served at
/metrics and readiness at /health (JSON; 503 while the worker waits for NATS
or a prefill worker) from start-up on.
"""

EPILOG = """\
environment: NATS_SERVER (NATS address), DYN_NAMESPACE, DYN_MIGRATION_LIMIT,
DYN_SYSTEM_HOST and DYN_SYSTEM_PORT (metrics listener), DYN_LOG (log level),
DYN_LOGGING_JSONL=1 (JSON lines). A flag given wins over its variable.
"""

#: The worker's own flags that vLLM's engine arguments also define: with
#: ``--engine vllm`` they are vLLM's (``vllm serve``'s spelling and meaning).
MODEL_FLAGS = ("--model", "--served-model-name", "--max-model-len", "--max-num-seqs")

PROG = "python -m dynamo_ctx.worker"


def _engine_of(argv: List[str]) -> str:
    """The --engine given in argv (mock when none), read before the full parse:
    it decides whose parser reads the rest."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--engine", default="mock")
    known, _ = pre.parse_known_args(argv)
    return str(known.engine)


def _vllm_parser() -> argparse.ArgumentParser:
    """vLLM's own parser with its engine arguments, as ``vllm serve`` builds it."""
    from vllm.engine.arg_utils import AsyncEngineArgs  # type: ignore[import-not-found]

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]
    except ImportError:  # older vLLM
        from vllm.utils import FlexibleArgumentParser  # type: ignore[import-not-found,attr-defined,no-redef]
    p = FlexibleArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _args.one_line_errors(p)
    AsyncEngineArgs.add_cli_args(p)
    return p  # type: ignore[no-any-return]


def _vllm_cpu_platform() -> None:
    """Let vLLM's parser build its help on a machine without a GPU: vLLM's
    newer versions take VLLM_TARGET_DEVICE=cpu, older ones (0.26) only look
    for a CPU build, so their platform is set to the CPU's when none was found."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    try:
        import vllm.platforms as platforms  # type: ignore[import-not-found]

        if not platforms.current_platform.device_type:
            from vllm.platforms.cpu import CpuPlatform  # type: ignore[import-not-found]

            platforms._current_platform = CpuPlatform()
    except Exception:  # noqa: BLE001 - the help is then vLLM's own error, as without this
        pass


def _has_accelerator() -> bool:
    """Whether this machine shows a GPU's device nodes (NVIDIA's or AMD's)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    engine = _engine_of(argv)
    vllm_installed = _args.engine_available("vllm")
    if engine == "vllm" and not vllm_installed:
        _errors.fail(
            PROG, f"--engine vllm needs vLLM, which is not installed here; install vllm or use --engine mock; see {PROG} --help", 2
        )
    helping = "-h" in argv or "--help" in argv
    if engine == "vllm" or (vllm_installed and helping):
        # vLLM's engine arguments as `vllm serve` spells them, parsed by
        # vLLM's parser (--help lists them); --model and the flags like it
        # are vLLM's. vLLM's parser infers its device from the machine: one
        # without a GPU can still read the help.
        if helping and not _has_accelerator():
            _vllm_cpu_platform()
        p = _vllm_parser()
    else:
        p = _args.ArgumentParser(PROG, DESCRIPTION, EPILOG)
        p.add("--model", default="mock-model", help="model name, or a model directory in the Hugging Face layout (its tokenizer "
              "and chat template become the frontend's text; the mock engine produces its vocabulary)")
        p.add_argument(
            "--served-model-name", nargs="+", metavar="NAME",
            help="the model's name for clients (default: --model); as vLLM, the first of several is used",
        )
        p.add(
            "--max-model-len", type=_args.positive_int,
            help="the model's context length (prompt + max_tokens), published with the instance; the frontend refuses "
            "longer requests (default: the model directory's config.json)",
        )
        p.add(
            "--max-num-seqs", type=_args.positive_int,
            help="sequences the engine runs at once, as vLLM's (the rest wait in the engine); published with the "
            "instance: the frontend sends each request to the worker with the most free places and queues the rest "
            "(default: no limit)",
        )
    p.add_argument(
        "--engine", choices=["mock", "vllm"], default="mock",
        help="the engine: the mock, or vLLM's AsyncLLM (then vLLM's engine arguments apply)",
    )
    _add_worker_flags(p)
    args = p.parse_args(argv)
    # The level the worker logs at: its --log-level (which add_logging's
    # parsing already made $DYN_LOG's or the default), or vLLM's (whose
    # value stays vLLM's too), else as add_logging's would be.
    args.worker_log_level = _args.level_of(p, getattr(args, "log_level", None))
    return args


def _add_worker_flags(p: argparse.ArgumentParser) -> None:
    """The worker's flags that are not the engine's."""
    add = functools.partial(_args.add_flag, p)
    add("--mode", choices=["agg", "prefill", "decode"], default="agg", help="what this worker does")
    add("--namespace", default="dynamo", env="DYN_NAMESPACE", help="namespace of the endpoints")
    add(
        "--migration-limit", type=_args.non_negative_int, default=0, env="DYN_MIGRATION_LIMIT",
        help="times a broken stream of this model may be moved to another worker",
    )
    add("--metrics-port", type=_args.port, env="DYN_SYSTEM_PORT", help="serve /metrics and /health on this port (0: any free port)")
    add("--metrics-host", default="127.0.0.1", env="DYN_SYSTEM_HOST", help="address of the metrics listener (loopback only by default)")
    # Their defaults are the library's status listener's (0 hands them over).
    add(
        "--metrics-read-timeout", type=_args.positive_float,
        help="seconds a metrics client has to send its request (default: the status listener's, docs/c-abi.md)",
    )
    add(
        "--metrics-max-connections", type=_args.positive_int,
        help="metrics connections held before their request arrived, and requests waiting for their answer; one more "
        "connection closes the oldest still sending its request, one more request is answered 503 "
        "(default: the status listener's, docs/c-abi.md)",
    )
    _args.add_nats_url(p)
    add(
        "--prefill-time-per-token",
        type=_args.non_negative_float,
        default=MockEngineArgs.prefill_time_per_token,
        help="mock engine: seconds per prompt token (each token in a step beyond one per sequence)",
    )
    add(
        "--decode-time-per-token",
        type=_args.non_negative_float,
        default=MockEngineArgs.decode_time_per_token,
        help="mock engine: seconds a step that decodes one sequence takes (a lone stream's time per output token)",
    )
    add(
        "--decode-time-per-seq",
        type=_args.non_negative_float,
        default=MockEngineArgs.decode_time_per_seq,
        help="mock engine: seconds each sequence after the first adds to a step (--decode-time-per-token is a step of one)",
    )
    # The mock's scheduler and KV cache, by vLLM's names (with --engine vllm these are vLLM's own).
    if "--max-num-batched-tokens" not in p._option_string_actions:
        add(
            "--max-num-batched-tokens", type=_args.positive_int,
            help=f"mock engine: tokens scheduled in one step, at most (default: {DEFAULT_MAX_NUM_BATCHED_TOKENS}, "
            "or --max-num-seqs if larger)",
        )
    if "--block-size" not in p._option_string_actions:
        add("--block-size", type=_args.positive_int, default=MockEngineArgs.block_size, help="mock engine: tokens a KV cache block holds")
    if "--num-gpu-blocks-override" not in p._option_string_actions:
        add(
            "--num-gpu-blocks-override", type=_args.positive_int, default=MockEngineArgs.num_kv_blocks,
            help="mock engine: blocks in its KV cache (requests wait for free blocks; the last admitted is preempted when they run out)",
        )
    add(
        "--engine-outputs", choices=["library", "vllm"], default="library", env="DYNAMO_CTX_ENGINE_OUTPUTS",
        help="vLLM engine: who reads its engine core's outputs and sends its inputs: the library (plain tokens go to "
        "their callers without the worker's Python, a stopped request is aborted from the library; docs/design.md, "
        "\"Engine outputs in the library\"), or vLLM itself, as before",
    )
    add(
        "--mock-die-after-steps", type=_args.positive_int,
        help="mock engine: its core dies after this many engine steps, a rehearsal of engine death (default: never)",
    )
    _add_parser_flags(p)
    _args.add_drain_timeout(
        p, "seconds the requests in flight get to finish after SIGTERM (the worker leaves discovery at once); "
        "then the rest are handed over (a migratable end) and the worker exits 0. A second signal ends it at once",
    )
    _args.add_event_loop(p)
    if "--log-level" in p._option_string_actions:
        # vLLM's engine arguments have their own (0.33 on): the worker's
        # logging follows it (its values are the same names, upper case).
        _args.add_flag(
            p, "--log-format", type=_args.log_format, default=_args.log_format_default(),
            help="text, or json for one JSON object per line (also env DYN_LOGGING_JSONL=1)",
        )
    else:
        _args.add_logging(p)


def _add_parser_flags(p: argparse.ArgumentParser) -> None:
    """The parsers the frontend reads this model's chat output with, by vLLM's names and
    flags (published in the model card; docs/openai-api.md, "Tools" and "Reasoning")."""
    tools = native().TOOL_CALL_PARSERS.split(",")
    _args.add_flag(
        p, "--tool-call-parser", choices=tools,
        help="how the model writes tool calls (vLLM's parser names: " + ", ".join(tools) + "); the frontend parses them "
        "into tool_calls and accepts tool_choice auto, required and a named function (default: none; tools are then "
        "rendered, and any tool_choice but none is refused)",
    )
    if "--enable-auto-tool-choice" not in p._option_string_actions:
        p.add_argument(
            "--enable-auto-tool-choice", action="store_true",
            help="vLLM's spelling, accepted: --tool-call-parser alone enables tool_choice auto",
        )
    if "--reasoning-parser" not in p._option_string_actions:  # with --engine vllm, vLLM's own flag
        reasoning = native().REASONING_PARSERS.split(",")
        _args.add_flag(
            p, "--reasoning-parser", choices=reasoning,
            help="how the model marks its reasoning (vLLM's parser names: " + ", ".join(reasoning) + "); the frontend "
            "returns it as reasoning_content, apart from content (default: none)",
        )


def served_model_name(args: argparse.Namespace) -> str:
    """The name clients use: the first --served-model-name, else --model."""
    names = getattr(args, "served_model_name", None)
    if isinstance(names, str):
        return names
    return names[0] if names else str(args.model)


def engine_args(args: argparse.Namespace) -> Any:
    """vLLM's ``AsyncEngineArgs`` from the parsed arguments (``--engine vllm``)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(args)


class Model:
    """What the worker serves: the name clients use, the model directory whose
    text the frontend speaks (None: the stand-in), and the context length."""

    def __init__(self, name: str, path: Optional[str], max_model_len: Optional[int], max_num_seqs: Optional[int] = None,
                 load_sink: Optional[LoadSink] = None) -> None:
        self.name = name
        self.path = path
        self.max_model_len = max_model_len
        #: The sequences the engine runs at once (None: no limit): the
        #: capacity the frontend routes and admits by.
        self.max_num_seqs = max_num_seqs
        #: Where the engine reports its waiting requests and KV usage
        #: (engineload.py), handed to the served endpoint.
        self.load_sink = load_sink


def engine_supports(engine: Any) -> List[str]:
    """The engine parameters (go/modelcard's EngineParams) ``engine`` honours: vLLM
    every one (SamplingParams takes them); the mock those it has (``SUPPORTS``)."""
    if isinstance(engine, MockAsyncLLM):
        return list(MockAsyncLLM.SUPPORTS)
    return native().ENGINE_PARAMS.split(",")


def model_card(model: Model, mode: str, migration_limit: int, supports: Optional[List[str]] = None,
               tool_call_parser: Optional[str] = None, reasoning_parser: Optional[str] = None) -> Dict[str, Any]:
    """The model card this worker publishes with its instance (docs/design.md, "The
    model card"): built and checked by the library (go/modelcard, its one definition),
    which reads the model directory's text files for their checksum. It blocks for that
    read. ValueError for a card that breaks a rule, OSError for an unreadable directory."""
    text = native().model_card(
        model.name, mode, migration_limit, max_num_seqs=model.max_num_seqs or 0, max_model_len=model.max_model_len or 0,
        model_path=model.path, supports=",".join(supports or []), tool_call_parser=tool_call_parser or None,
        reasoning_parser=reasoning_parser or None,
    )
    card: Dict[str, Any] = json.loads(text)
    return card


def mock_model(args: argparse.Namespace) -> Tuple[Any, Model]:
    """The mock engine and its model: with a model directory, the mock produces
    its vocabulary and the context length is its config.json's unless
    --max-model-len says otherwise."""
    path = model_dir.find(args.model)
    batched = args.max_num_batched_tokens
    mock = MockEngineArgs(
        prefill_time_per_token=args.prefill_time_per_token, decode_time_per_token=args.decode_time_per_token,
        decode_time_per_seq=args.decode_time_per_seq, max_num_batched_tokens=batched, block_size=args.block_size,
        num_kv_blocks=args.num_gpu_blocks_override, die_after_steps=args.mock_die_after_steps, max_num_seqs=args.max_num_seqs,
    )
    length = args.max_model_len
    if path is not None:
        mock.token_ids = model_dir.vocabulary(path)
        if length is None:
            length = model_dir.max_model_len(path)
    elif os.path.isdir(args.model):
        raise _errors.UsageError(
            f"--model {args.model}: the directory has no tokenizer.json (a model directory in the Hugging Face layout)"
        )
    try:
        engine = MockAsyncLLM(mock)
    except ValueError as e:  # the mock's own rule (e.g. a token budget below --max-num-seqs), in its words
        raise _errors.UsageError(f"mock engine: {e}") from None
    engine.load_sink = LoadSink()
    return engine, Model(served_model_name(args), path, length, args.max_num_seqs, engine.load_sink)


def cache_vllm_environment() -> None:
    """Make vLLM read its environment variables once from now on (``vllm.envs.
    enable_envs_cache``, as its engine core does once it has started): its
    output path looks some up for every output of every step (``envs.VLLM_*``,
    each an ``os.getenv`` and more, 5% of the worker's Python at 16 streams).
    Nothing changes the worker's environment once its engine runs. A vLLM
    without the function reads them as before."""
    import vllm.envs  # type: ignore[import-not-found]

    enable = getattr(vllm.envs, "enable_envs_cache", None)
    if callable(enable):
        enable()


def vllm_model(args: argparse.Namespace) -> Tuple[Any, Model]:
    """vLLM's engine and its model (the context length is the engine's own)."""
    from vllm.v1.engine.async_llm import AsyncLLM  # type: ignore[import-not-found]

    sink = LoadSink()  # the scheduler's waiting requests and KV usage, from vLLM's own stats
    engine = AsyncLLM.from_engine_args(engine_args(args), stat_loggers=[vllm_stat_logger(sink)])
    cache_vllm_environment()
    length = getattr(getattr(engine, "model_config", None), "max_model_len", None)
    # The engine's own capacity (vLLM resolves its default from the machine).
    seqs = getattr(getattr(getattr(engine, "vllm_config", None), "scheduler_config", None), "max_num_seqs", None)
    path = model_dir.find(getattr(args, "tokenizer", None) or args.model)
    return engine, Model(served_model_name(args), path, length, seqs if isinstance(seqs, int) and seqs > 0 else None, sink)


def make_engine(args: argparse.Namespace) -> Any:
    """The engine alone (see mock_model and vllm_model)."""
    return (vllm_model(args) if args.engine == "vllm" else mock_model(args))[0]


class Readiness:
    """What the worker waits for before it serves requests (None: nothing, it
    serves), or why it no longer does (``failed``: the engine died)."""

    def __init__(self, waiting_for: Optional[str]) -> None:
        self.waiting_for = waiting_for
        self.failed: Optional[str] = None
        self.draining = False

    def render(self) -> Tuple[str, bytes]:
        """The /health answer: status line and JSON body."""
        if self.failed is not None:
            return "503 Service Unavailable", (json.dumps({"status": "error", "reason": self.failed}) + "\n").encode()
        if self.draining:
            return "503 Service Unavailable", b'{"status":"draining"}\n'
        if self.waiting_for is None:
            return "200 OK", b'{"status":"ready"}\n'
        return "503 Service Unavailable", (json.dumps({"status": "waiting", "waiting_for": self.waiting_for}) + "\n").encode()

    def answer(self) -> "_status.Answer":
        """The /health answer for the status listener: code, content type, body."""
        line, body = self.render()
        return int(line.split()[0]), "application/json", body


def status_routes(metrics: WorkerMetrics, engine: Any, readiness: Readiness) -> Dict[str, Callable[[], "_status.Answer"]]:
    """The worker's status endpoints: ``/metrics`` (Prometheus text, rendered
    by prometheus_client at each scrape), ``/health`` and ``/ready`` (JSON
    readiness: 200 when serving, 503 with what it waits for otherwise) and
    ``/live``."""

    def prometheus() -> "_status.Answer":
        from prometheus_client import CONTENT_TYPE_LATEST

        return 200, CONTENT_TYPE_LATEST, metrics.exposition(engine)

    return {
        "/metrics": prometheus, "/health": readiness.answer, "/ready": readiness.answer,
        "/live": lambda: (200, _status.TEXT, b"alive\n"),
    }


#: How often the worker checks that its engine is alive while no request
#: would tell it (vLLM's engine core can die between requests).
ENGINE_CHECK_INTERVAL = 0.1


async def _watch_engine(engine: Any, dead: Any) -> None:
    """Call ``dead(error)`` once the engine reports itself errored."""
    while True:
        await asyncio.sleep(ENGINE_CHECK_INTERVAL)
        try:
            errored = bool(getattr(engine, "errored", False))
        except Exception:  # noqa: BLE001 - a failing property is no verdict
            errored = False
        if errored:
            dead(getattr(engine, "dead_error", None) or RuntimeError("the engine reports itself errored"))
            return


#: Seconds a dead engine's shutdown may take before the worker exits anyway.
ENGINE_SHUTDOWN_TIMEOUT = 10.0
#: Seconds, at least, that /health answers 503 with the reason after the
#: engine died, before the worker exits.
DEAD_ENGINE_HEALTH_SECONDS = 1.0


async def _shutdown_engine(engine: Any) -> None:
    """Shut the engine down (vLLM's ``AsyncLLM.shutdown`` stops its processes)
    in a thread, so that the event loop keeps answering /health meanwhile."""
    shutdown = getattr(engine, "shutdown", None)
    if not callable(shutdown):
        return
    try:
        await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, shutdown), ENGINE_SHUTDOWN_TIMEOUT)
    except Exception as e:  # noqa: BLE001 - a dead engine may fail its own shutdown; the worker exits all the same
        logger.debug("the engine's shutdown failed: %s: %s", type(e).__name__, e)


def _bind_metrics(args: argparse.Namespace) -> Optional[socket.socket]:
    """The port of --metrics-port, bound (None without one): clients wait in
    its listen queue until the library serves it (_serve_status)."""
    if args.metrics_port is None:
        return None
    try:
        sock = _status.bind(args.metrics_host, args.metrics_port)
    except OSError as e:
        raise _errors.listen_error(e, args.metrics_host, args.metrics_port, "--metrics-port", "--metrics-host") from None
    host, port = sock.getsockname()[:2]
    logger.info("metrics at http://%s:%d/metrics, readiness at /health", host, port)
    return sock


def _serve_status(sock: Optional[socket.socket], args: argparse.Namespace, routes: Dict[str, Callable[[], "_status.Answer"]]
                  ) -> Optional[_status.StatusServer]:
    """The library's status listener on the bound port (it loads the library),
    answering ``routes`` on the running loop."""
    if sock is None:
        return None
    server = _status.StatusServer(
        sock, routes, read_timeout=args.metrics_read_timeout or 0, max_connections=args.metrics_max_connections or 0
    )
    server.start()
    return server


async def run(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    name = served_model_name(args)
    metrics = WorkerMetrics(name)
    engine: Any = None
    readiness = Readiness("the engine to load")
    # First of all the port is bound; the library answers it once the engine
    # is made (the engine may fork: the library loads after it), before the
    # worker waits on anything.
    metrics_sock = _bind_metrics(args)
    metrics_server: Optional[_status.StatusServer] = None
    runtime: Optional[DistributedRuntime] = None
    handler: BaseWorkerHandler
    died: List[Tuple[str, float]] = []  # (why, when), once the engine died
    watch: "Optional[asyncio.Future[None]]" = None
    files_serving: "Optional[asyncio.Future[None]]" = None

    def engine_dead(error: BaseException) -> None:
        # Once: /health says why, the log says it once, and the runtime's
        # shutdown ends every stream without its final marker (migration
        # continues them elsewhere); run then exits non-zero so that an
        # orchestrator restarts the worker.
        if died:
            return
        reason = f"the engine died: {type(error).__name__}: {error}"
        died.append((reason, loop.time()))
        readiness.failed = reason
        logger.error("%s; handing the requests in flight over to other workers and exiting", reason)
        if runtime is not None:
            loop.call_soon(runtime.shutdown)

    try:
        if args.engine == "vllm":
            # vLLM's engine runs in processes of its own: they must die with this
            # worker, also when it is SIGKILLed (see reaper's doc).
            reaper.start()
        engine, model = vllm_model(args) if args.engine == "vllm" else mock_model(args)
        if args.engine == "vllm":
            reaper.poke()  # the engine is ready: its processes recorded at once, and the reaper's scans may slow
        metrics_server, metrics_sock = _serve_status(metrics_sock, args, status_routes(metrics, engine, readiness)), None
        if args.engine == "vllm" and args.engine_outputs == "library":
            reader = await EngineOutputs.take(engine)  # before any request (or nothing, logged, where it cannot)
            if reader is not None:
                metrics.library_sent_tokens = reader.sent
                metrics.library_aborts = reader.aborts
        readiness.waiting_for = f"NATS at {_errors.nats_address(args.nats_url)}"
        runtime = await _runner.connect_runtime(args.nats_url)
        logger.info("migration_limit=%d for model %s", args.migration_limit, model.name)
        if model.path is not None:
            logger.info("model %s: text from %s", model.name, model.path)
        if args.mode == "prefill":
            component, handler = "prefill", PrefillHandler(engine, model.name, metrics)
        elif args.mode == "decode":
            prefill_path = f"{args.namespace}.prefill.generate"
            prefill_client = await runtime.endpoint(prefill_path).client(migration_limit=args.migration_limit)
            readiness.waiting_for = f"a prefill worker on {prefill_path}"
            logger.info("waiting for a prefill worker")
            await prefill_client.wait_for_instances()
            component, handler = "backend", DecodeHandler(engine, prefill_client, model.name, metrics)
        else:
            component, handler = "backend", AggregatedHandler(engine, model.name, metrics)
        handler.engine_dead = engine_dead
        if model.max_model_len is not None:
            handler.max_model_len = model.max_model_len
        watch = asyncio.ensure_future(_watch_engine(engine, engine_dead))
        endpoint = runtime.namespace(args.namespace).component(component).endpoint("generate")
        readiness.waiting_for = f"registration of {endpoint.path}"
        card = await loop.run_in_executor(
            None, model_card, model, args.mode, args.migration_limit, engine_supports(engine), args.tool_call_parser,
            getattr(args, "reasoning_parser", None),
        )
        if model.path is not None and component == "backend":
            # For frontends that cannot read the directory (another machine):
            # the same card, so that a frontend asks a worker with the same files;
            # without max_num_seqs, which would bound its fetches as the engine's
            # requests are bounded (docs/design.md, section 10).
            files = runtime.namespace(args.namespace).component(component).endpoint("model_files")
            files_card = {k: v for k, v in card.items() if k != "max_num_seqs"}
            files_serving = asyncio.ensure_future(files.serve_endpoint(model_dir.files_handler(model.path), metadata=files_card))
        serving = asyncio.ensure_future(endpoint.serve_endpoint(handler.generate, metadata=card))
        instance = await endpoint.serving()
        metrics.busy_refusals = endpoint.busy_refusals
        if model.load_sink is not None:
            model.load_sink.attach(endpoint.set_engine_load)
        readiness.waiting_for = None
        logger.info("serving %s as instance %d (model %s, mode %s)", endpoint.path, instance, model.name, args.mode)
        # What start-up made (modules, the engine, its model) lives as long as
        # the worker: out of the collector's reach, each collection of the
        # requests' garbage no longer walks it (vLLM's engine core does the same).
        gc.collect()
        gc.freeze()
        drain: "Optional[asyncio.Future[bool]]" = None
        rt = runtime

        def on_signal() -> None:
            # The first signal drains (leave discovery, finish, hand the rest
            # over after --drain-timeout); a second one ends it at once.
            nonlocal drain
            if drain is None:
                readiness.draining = True
                logger.info("draining: left discovery; the requests in flight get %g s", args.drain_timeout)
                drain = asyncio.ensure_future(rt.drain(args.drain_timeout))
            else:
                logger.info("a second signal: stopping now")
                rt.shutdown()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        await serving
        if drain is not None:
            finished = await drain
            logger.info("drained: %s", "every request finished" if finished else "the requests still running were handed over")
    finally:
        if watch is not None:
            watch.cancel()
        if files_serving is not None:
            files_serving.cancel()
        if runtime is not None:
            runtime.shutdown()
        if died:
            # /health keeps saying why until the process ends: the engine's own
            # shutdown (its processes) runs while the listener answers, then the
            # process ends at once (its finalization would wait seconds on what
            # the dead engine held) with status 1, for its orchestrator.
            try:
                await _shutdown_engine(engine)
                # Long enough for a probe to read why (a load balancer's, a person's).
                await asyncio.sleep(max(0.0, died[0][1] + DEAD_ENGINE_HEALTH_SECONDS - loop.time()))
            finally:
                _errors.exit_now(PROG, f"{died[0][0]}; exiting so that the worker is restarted", 1)
        if metrics_server is not None:
            metrics_server.close()
        if metrics_sock is not None:  # the engine failed before the library served it
            metrics_sock.close()


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    _logging.setup_logging(args.worker_log_level, args.log_format)
    _runner.run_command(PROG, lambda: run(args), _args.log_level(args.worker_log_level) == "debug", args.event_loop)


if __name__ == "__main__":
    main()
