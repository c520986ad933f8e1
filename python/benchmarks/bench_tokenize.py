"""Where to tokenize: the frontend in Go (go/tokenizer, go/hfmodel) against the worker in
Python with Hugging Face's own ``tokenizers`` and ``jinja2`` (what vLLM's server uses), on
the same Llama-3-style tokenizer (16k vocabulary) and a ~4,000-token prompt.

    python python/benchmarks/bench_tokenize.py

Go's figures come from ``go test -bench`` (go/tokenizer's Encode4k, Encode4kCold,
Decode4k, Stream4k and go/hfmodel's RenderChat); Python's are the best of 5 timeit runs.
Per-token detokenization is the cost every output token pays: Go's StreamDecoder in the
frontend, or tokenizers' DecodeStream in the worker's Python.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "go" / "tokenizer" / "testdata" / "bench"
TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def go_bench() -> dict:
    out = {}
    for pkg, pattern in (("./go/tokenizer/", "Encode4k$|Encode4kCold|Decode4k|Stream4k"), ("./go/hfmodel/", "RenderChat")):
        res = subprocess.run(["go", "test", pkg, "-run", "^$", "-bench", pattern, "-benchmem", "-count", "3"],
                             cwd=ROOT, capture_output=True, text=True, check=True)
        for line in res.stdout.splitlines():
            m = re.match(r"Benchmark(\w+)-\d+\s+\d+\s+([\d.]+) ns/op", line)
            if m:
                out[m.group(1)] = min(out.get(m.group(1), float("inf")), float(m.group(2)) / 1000)
    return out


def best(f, number: int) -> float:
    return min(timeit.repeat(f, number=number, repeat=5)) / number * 1e6


def main() -> None:
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream

    tok = Tokenizer.from_str(gzip.decompress((BENCH / "tokenizer.json.gz").read_bytes()).decode())
    text = (BENCH / "prompt.txt").read_text()
    ids = tok.encode(text, add_special_tokens=False).ids
    py = {"Encode4k": best(lambda: tok.encode(text, add_special_tokens=False), 20)}
    py["Decode4k"] = best(lambda: tok.decode(ids), 20)

    def stream() -> None:
        ds = DecodeStream(skip_special_tokens=True)
        for i in ids:
            ds.step(tok, i)

    py["Stream4k"] = best(stream, 3)
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    tpl = env.from_string(TEMPLATE)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    py["RenderChat"] = best(lambda: tpl.render(messages=msgs, add_generation_prompt=True, bos_token="<|begin_of_text|>"), 50)
    go = go_bench()
    print(f"tokenizer: Llama-3 style byte-level BPE, {tok.get_vocab_size()} tokens; prompt: {len(ids)} tokens, {len(text.encode())} bytes")
    print(f"{'':34} {'Go (frontend)':>14} {'Python (worker)':>16} {'Python/Go':>10}")
    rows = [("encode, cache warm (us)", "Encode4k"), ("encode, cache cold (us)", "Encode4kCold"), ("decode all (us)", "Decode4k"),
            ("stream decode, per token (us)", "Stream4k"), ("render chat, 4k-token message (us)", "RenderChat")]
    for label, key in rows:
        g, p = go.get(key), py.get(key)
        if key == "Stream4k":
            g = g / len(ids) if g else None
            p = p / len(ids) if p else None
        gs = f"{g:14.2f}" if g is not None else f"{'-':>14}"
        ps = f"{p:16.2f}" if p is not None else f"{'-':>16}"
        ratio = f"{p / g:10.1f}" if g and p else f"{'-':>10}"
        print(f"{label:34} {gs} {ps} {ratio}")
    print(json.dumps({"go_us": go, "python_us": py, "prompt_tokens": len(ids)}))


if __name__ == "__main__":
    sys.exit(main())
