"""vLLM smoke check on one GPU: the engine paths dynamo_ctx's vLLM backend relies on.

    python python/benchmarks/gpu/vllm_smoke.py [--model DIR] [--timeout 240]

In one process, on the tiny random Llama that make_tiny_llama.py writes (made in
--model when that directory has no config.json):

  cli      vLLM's own parser: AsyncEngineArgs.add_cli_args, then from_cli_args.
  agg      AsyncLLM.from_engine_args (enforce_eager, gpu_memory_utilization 0.2,
           max_model_len 512); 8 tokens for a token prompt with
           SamplingParams(max_tokens=8, output_kind=DELTA, detokenize=False);
           a second request aborted mid-stream, with vLLM's Prometheus gauges
           (vllm:num_requests_running, vllm:kv_cache_usage_perc) before and
           after the abort.
  pd       a prefill engine and a decode engine on the same GPU, both with
           vLLM's built-in ExampleConnector (KV through files in a shared
           folder; no extra package): the prefill request has max_tokens=1 and
           extra_args={"kv_transfer_params": {"do_remote_decode": True}}, its
           RequestOutput.kv_transfer_params is printed; the decode engine then
           runs the same prompt and must load the prompt's KV from the folder
           (RequestOutput.num_cached_tokens > 0).

Every result line starts with "SMOKE"; the last is "SMOKE RESULT: PASS" or
"SMOKE RESULT: FAIL ...". Exit status 0 on pass, 1 on a failed check, 2 when
this machine cannot run it (no GPU, no vLLM). A watchdog (--timeout) dumps every
thread's stack and exits 1 if anything hangs.

Environment set here unless already set: VLLM_USE_FLASHINFER_SAMPLER=0 (the
wheel set has no FlashInfer; vLLM's sampler would otherwise import it on CUDA),
VLLM_NO_USAGE_STATS=1, DO_NOT_TRACK=1, HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1,
PYTORCH_NVML_BASED_CUDA_CHECK=1. This process never initialises CUDA itself (vLLM
forks its engine process; CUDA initialised before a fork fails in the child).
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

for _k, _v in {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}.items():
    os.environ.setdefault(_k, _v)

HERE = Path(__file__).resolve().parent
T0 = time.monotonic()
RESULTS: List[Dict[str, Any]] = []
SUMMARY: Dict[str, Any] = {}

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def say(msg: str) -> None:
    print(f"SMOKE [{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def check(name: str, ok: bool, detail: str = "") -> bool:
    RESULTS.append({"check": name, "ok": bool(ok), "detail": detail})
    say(f"CHECK {name}: {'PASS' if ok else 'FAIL'}{' - ' + detail if detail else ''}")
    return bool(ok)


def finish(code: int, why: str = "") -> None:
    failed = [r["check"] for r in RESULTS if not r["ok"]]
    SUMMARY["failed_checks"] = failed
    SUMMARY["seconds"] = round(time.monotonic() - T0, 1)
    print("SMOKE SUMMARY " + json.dumps(SUMMARY, default=str), flush=True)
    if code == 0 and failed:
        code = 1
    if code == 0:
        print("SMOKE RESULT: PASS", flush=True)
    else:
        print(f"SMOKE RESULT: FAIL ({why or ', '.join(failed)})", flush=True)
    sys.stdout.flush()
    # Engine-core children are ended by their own shutdown; _exit so that no
    # interpreter-exit hook of a half-shut engine can hang the run.
    os._exit(code)


def environment_or_exit() -> None:
    """The machine's facts, or exit 2 with a clear line when it cannot run this.

    Nothing here may initialise CUDA in this process: vLLM forks its engine
    process, and a CUDA driver initialised before a fork fails in the child
    (torch.cuda.is_available() would do it; NVML does not)."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        say(f"ERROR torch is not importable: {e!r}")
        finish(2, "no torch")
    try:
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            from vllm.third_party import pynvml  # vLLM's own copy

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        names = []
        for i in range(count):
            n = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(n.decode() if isinstance(n, bytes) else n)
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    except Exception as e:  # noqa: BLE001
        count, names, driver = 0, [], f"none ({e!r})"
    if count == 0:
        say(f"ERROR no NVIDIA GPU visible (NVML: {driver}): this smoke check needs the GPU machine")
        finish(2, "no GPU")
    try:
        import vllm
    except Exception as e:  # noqa: BLE001
        say(f"ERROR vLLM is not importable: {e!r}; install the wheel set "
            "(python/benchmarks/gpu/stage/reassemble.sh) and export PYTHONPATH=/tmp/site")
        finish(2, "no vLLM")
    import transformers

    SUMMARY.update(
        python=sys.version.split()[0],
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        vllm=vllm.__version__,
        vllm_file=vllm.__file__,
        transformers=transformers.__version__,
        gpu=names,
        driver=driver,
    )
    say(
        f"ENV python={SUMMARY['python']} torch={torch.__version__} cuda={torch.version.cuda} vllm={vllm.__version__} "
        f"({os.path.dirname(vllm.__file__)}) transformers={transformers.__version__} gpus={names} driver={driver}"
    )


def ensure_model(model: Path) -> None:
    if (model / "config.json").exists():
        say(f"MODEL {model} (exists)")
        return
    # In a child process: nothing of transformers' model code runs in this one
    # before vLLM forks its engine. Started by the harness (python/tests/harness).
    sys.path.insert(0, str(HERE.parents[1] / "tests"))
    from harness import run_python

    t = time.monotonic()
    r = run_python(str(HERE / "make_tiny_llama.py"), str(model), timeout=None)
    if r.returncode != 0:
        say(f"ERROR make_tiny_llama.py failed ({r.returncode}): {(r.stdout + r.stderr)[-2000:]}")
        finish(2, "no model")
    say(f"MODEL {model} made in {time.monotonic() - t:.1f}s: {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ''}")


def gauges() -> Dict[str, float]:
    """vLLM's gauges in prometheus_client's default registry, where AsyncLLM registers them."""
    from prometheus_client import REGISTRY

    out: Dict[str, float] = {}
    for fam in REGISTRY.collect():
        for s in fam.samples:
            if s.name in GAUGES or (s.name.startswith("vllm:external_prefix_cache") and s.name.endswith("_total")):
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "model_name")
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def gauge(values: Dict[str, float], name: str) -> float:
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


def print_gauges(when: str, values: Dict[str, float]) -> None:
    for k in sorted(values):
        if k.split("{")[0] in GAUGES:
            say(f"METRIC {when} {k} {values[k]}")


def engine_args_from_cli(model: Path, extra: List[str]) -> Any:
    """AsyncEngineArgs through vLLM's own parser, as dynamo_ctx's worker builds them."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    argv = ["--model", str(model), "--enforce-eager", "--gpu-memory-utilization", "0.2", "--max-model-len", "512"] + extra
    return AsyncEngineArgs.from_cli_args(parser.parse_args(argv))


def start_engine(label: str, engine_args: Any) -> Any:
    from vllm.v1.engine.async_llm import AsyncLLM

    t = time.monotonic()
    engine = AsyncLLM.from_engine_args(engine_args)
    dt = time.monotonic() - t
    SUMMARY[f"{label}_start_s"] = round(dt, 1)
    say(f"ENGINE {label} started in {dt:.1f}s")
    return engine


def stop_engine(label: str, engine: Any) -> None:
    if engine is None:
        return
    t = time.monotonic()
    try:
        engine.shutdown()
        say(f"ENGINE {label} shut down in {time.monotonic() - t:.1f}s")
    except Exception as e:  # noqa: BLE001
        say(f"ENGINE {label} shutdown raised {e!r}")


def prompt_ids(n: int, salt: int) -> List[int]:
    """n token ids: <s> then ordinary words of the tiny vocabulary (ids 30..3999)."""
    return [1] + [30 + (salt * 131 + i * 37) % 3970 for i in range(n - 1)]


def delta_params(max_tokens: int, **kw: Any) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    # temperature 0 and ignore_eos: a random model must still produce exactly max_tokens.
    return SamplingParams(
        max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA, detokenize=False, temperature=0.0, ignore_eos=True, **kw
    )


async def phase_agg(model: Path, kv_blocks: int) -> None:
    extra = ["--num-gpu-blocks-override", str(kv_blocks)] if kv_blocks > 0 else []
    args = engine_args_from_cli(model, extra)
    check("cli add_cli_args/from_cli_args", args.model == str(model) and args.enforce_eager, f"model={args.model}")
    engine = start_engine("agg", args)
    try:
        # 1) 8 tokens, streamed as deltas.
        got: List[int] = []
        chunks = 0
        last = None
        async for out in engine.generate({"prompt_token_ids": prompt_ids(20, 1)}, delta_params(8), request_id="smoke-gen"):
            chunks += 1
            got.extend(out.outputs[0].token_ids)
            last = out
        fin = last.outputs[0].finish_reason if last else None
        say(f"GENERATE tokens={got} chunks={chunks} finish_reason={fin} text={last.outputs[0].text!r}" if last else "GENERATE no output")
        SUMMARY["generate_tokens"] = got
        check(
            "generate 8 tokens (DELTA, detokenize=False)",
            len(got) == 8 and last is not None and last.finished,
            f"{len(got)} tokens, {chunks} chunks",
        )

        idle = gauges()
        print_gauges("idle", idle)

        # 2) A long request aborted mid-stream.
        rid = "smoke-abort"
        seen = 0
        before: Dict[str, float] = {}
        final = None
        async for out in engine.generate({"prompt_token_ids": prompt_ids(40, 2)}, delta_params(400), request_id=rid):
            seen += len(out.outputs[0].token_ids)
            if out.finished:
                final = out
                break
            if seen >= 4 and not before:
                before = gauges()
                await engine.abort(rid)
                say(f"ABORT sent after {seen} tokens")
        reason = final.outputs[0].finish_reason if final else None
        say(f"ABORT stream ended: tokens_seen={seen} finished={bool(final)} finish_reason={reason}")
        check(
            "abort mid-stream ends the stream with finish_reason=abort", reason == "abort" and seen < 400, f"reason={reason} tokens={seen}"
        )
        print_gauges("before-abort", before)
        # The engine publishes its gauges with each step's output; the step after
        # an abort carries the freed state. Poll for it.
        after = gauges()
        deadline = time.monotonic() + 5
        while gauge(after, "vllm:num_requests_running") != 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            after = gauges()
        print_gauges("after-abort", after)
        run_b, run_a = gauge(before, "vllm:num_requests_running"), gauge(after, "vllm:num_requests_running")
        kv_b, kv_a = gauge(before, "vllm:kv_cache_usage_perc"), gauge(after, "vllm:kv_cache_usage_perc")
        SUMMARY["metrics"] = {"running_before": run_b, "running_after": run_a, "kv_usage_before": kv_b, "kv_usage_after": kv_a}
        check("vllm:num_requests_running 1 -> 0 across the abort", run_b == 1 and run_a == 0, f"{run_b} -> {run_a}")
        check("vllm:kv_cache_usage_perc falls to 0 after the abort", kv_b > 0 and kv_a == 0, f"{kv_b} -> {kv_a}")
    finally:
        stop_engine("agg", engine)


async def phase_pd(model: Path, store: Path, decode: bool) -> None:
    if store.exists():
        shutil.rmtree(store)
    store.mkdir(parents=True)

    def kv(role: str) -> List[str]:
        cfg = {"kv_connector": "ExampleConnector", "kv_role": role, "kv_connector_extra_config": {"shared_storage_path": str(store)}}
        return ["--kv-transfer-config", json.dumps(cfg)]

    SUMMARY["kv_transfer_config_prefill"] = json.loads(kv("kv_producer")[1])
    # 40 tokens: ExampleConnector stores whole 16-token blocks of the prompt but its
    # last token, so 32 tokens travel.
    prompt = {"prompt_token_ids": prompt_ids(40, 3)}
    prefill = decode_engine = None
    try:
        prefill = start_engine("prefill", engine_args_from_cli(model, kv("kv_producer")))
        last = None
        got: List[int] = []
        params = delta_params(1, extra_args={"kv_transfer_params": {"do_remote_decode": True}})
        async for out in prefill.generate(prompt, params, request_id="smoke-prefill"):
            got.extend(out.outputs[0].token_ids)
            last = out
        ktp = getattr(last, "kv_transfer_params", "<no attribute>") if last else "<no output>"
        say(f"PREFILL tokens={got} finish_reason={last.outputs[0].finish_reason if last else None} kv_transfer_params={ktp!r}")
        SUMMARY["prefill_kv_transfer_params"] = ktp
        files = sorted(str(p.relative_to(store)) for p in store.rglob("*.safetensors"))
        say(f"PREFILL KV files in {store}: {files}")
        check("prefill: 1 token, KV saved by ExampleConnector", len(got) == 1 and len(files) > 0, f"{len(files)} files")
        if not decode:
            return
        decode_engine = start_engine("decode", engine_args_from_cli(model, kv("kv_consumer")))
        dparams = delta_params(8, extra_args={"kv_transfer_params": ktp}) if isinstance(ktp, dict) else delta_params(8)
        got, last = [], None
        cached: Optional[int] = None
        async for out in decode_engine.generate(prompt, dparams, request_id="smoke-decode"):
            got.extend(out.outputs[0].token_ids)
            last = out
            n = getattr(out, "num_cached_tokens", None)
            if n is not None:
                cached = max(cached or 0, n)
        say(f"DECODE tokens={got} num_cached_tokens={cached} finish_reason={last.outputs[0].finish_reason if last else None}")
        ext = {k: v for k, v in gauges().items() if k.startswith("vllm:external_prefix_cache")}
        for k in sorted(ext):
            say(f"METRIC decode {k} {ext[k]}")
        SUMMARY["decode_num_cached_tokens"] = cached
        check(
            "decode: 8 tokens with the prompt's KV loaded from the prefill's files",
            len(got) == 8 and bool(cached),
            f"num_cached_tokens={cached}",
        )
    finally:
        stop_engine("decode", decode_engine)
        stop_engine("prefill", prefill)


async def run(opts: argparse.Namespace) -> None:
    phases = [p.strip() for p in opts.phases.split(",") if p.strip()]
    for phase in phases:
        t = time.monotonic()
        say(f"PHASE {phase} start")
        try:
            if phase == "agg":
                await phase_agg(opts.model, opts.kv_blocks)
            elif phase == "pd":
                await phase_pd(opts.model, opts.kv_store, decode=not opts.no_decode)
            else:
                check(f"phase {phase}", False, "unknown phase")
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            check(f"phase {phase} ran", False, f"{type(e).__name__}: {e}")
        say(f"PHASE {phase} done in {time.monotonic() - t:.1f}s")


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=Path("/tmp/dc-tiny-llama"), help="model directory (made when missing)")
    ap.add_argument("--phases", default="agg,pd", help="comma-separated: agg, pd (default: both)")
    ap.add_argument("--no-decode", action="store_true", help="pd: stop after the prefill request")
    ap.add_argument("--kv-store", type=Path, default=Path("/tmp/dc-kv-smoke"), help="ExampleConnector's shared folder (emptied)")
    ap.add_argument(
        "--kv-blocks",
        type=int,
        default=256,
        help="--num-gpu-blocks-override for the agg engine, so that kv_cache_usage_perc is visibly above 0 (0: vLLM's own count)",
    )
    ap.add_argument("--timeout", type=float, default=240, help="watchdog seconds: dump all stacks and exit 1")
    opts = ap.parse_args(argv)

    faulthandler.dump_traceback_later(opts.timeout, exit=True)
    environment_or_exit()
    ensure_model(opts.model)
    asyncio.run(run(opts))
    finish(0)


if __name__ == "__main__":
    main()
