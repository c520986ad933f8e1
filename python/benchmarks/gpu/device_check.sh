#!/usr/bin/env bash
# The GPU check (not run yet: no GPU machine has been lent), run on a GPU machine from the
# repository root, offline: vLLM and its missing dependencies arrive as a wheel bundle
# in .stage/chunkNN/ (made here by python/benchmarks/gpu/stage/stage.sh; its README
# says how the chunks travel), the native library as .stage/native/_native.abi3.so.xz
# where it is not built there.
#
#   OUT=/some/dir bash python/benchmarks/gpu/device_check.sh
#
# Makes the tiny random Llama (make_tiny_llama.py), installs the bundle into /tmp/site,
# and runs vllm_e2e.py (frontend + vLLM workers, aggregated and prefill/decode, client
# disconnects in prefill and decode). Results: $OUT/e2e.json and the processes' logs.
set -uo pipefail
OUT=${OUT:-/tmp/dc-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ ! -f python/dynamo_ctx/_native.abi3.so ] && [ -f .stage/native/_native.abi3.so.xz ]; then
  xz -dc .stage/native/_native.abi3.so.xz > python/dynamo_ctx/_native.abi3.so || exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
[ -f /tmp/dc-tiny-llama/model.safetensors ] || python3 python/benchmarks/gpu/make_tiny_llama.py /tmp/dc-tiny-llama | tail -1
if ! python3 -c "import sys; sys.path.insert(0, '/tmp/site'); import vllm" 2>/dev/null; then
  bash python/benchmarks/gpu/stage/reassemble.sh > "$OUT/reassemble.log" 2>&1 || { tail -15 "$OUT/reassemble.log"; exit 5; }
  grep -E "REASSEMBLE (installed|imported|FAIL)" "$OUT/reassemble.log" | tail -3
fi
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1
LOGS=/tmp/dc-e2e-logs
rm -rf "$LOGS"
timeout 480 python3 python/benchmarks/gpu/vllm_e2e.py --model /tmp/dc-tiny-llama --out "$OUT/e2e.json" --logs "$LOGS" 2>&1 \
  | grep --line-buffered -E "^E2E|Traceback|Error" | grep -v "^E2E SUMMARY"
rc=${PIPESTATUS[0]}
for f in agg prefill decode frontend; do [ -f "$LOGS/$f.log" ] && tail -c 2000000 "$LOGS/$f.log" > "$OUT/$f.log"; done
exit "$rc"
