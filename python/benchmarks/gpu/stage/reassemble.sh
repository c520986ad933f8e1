#!/usr/bin/env bash
# Reassemble the vLLM wheel set from .stage/chunkNN/ and install it into /tmp/site.
#
# stage.sh (beside this file) builds .stage/chunkNN/ here; on the GPU machine, once
# every chunk folder has arrived (each device call carries one: .stage/chunk01, then
# .stage/chunk02, ... while the machine stays warm), from the repo root:
#
#     bash python/benchmarks/gpu/stage/reassemble.sh    # the committed copy (device_check.sh runs this)
#     bash .stage/chunkNN/reassemble.sh                 # or the copy in any chunk folder
#     export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1
#
# The chunks are looked for in STAGE if set, else in the folder above a chunk folder
# (a travelling copy), else in the .stage/ folder the script sits in, else in
# <repo root>/.stage (the committed copy, four folders up).
# It checks each part's and the whole bundle's SHA-256, unpacks the xz tarball of
# wheels (xz, or Python's lzma where xz is missing), checks every wheel's SHA-256,
# installs them with pip --no-index --no-deps --target, and imports vLLM from there.
# Environment: STAGE, SITE (default /tmp/site), WORK (scratch, default /tmp/dc-whl),
# PYTHON (default python3; it must be a Python 3.12: the wheels are cp312).
# Exit status: 0 installed; 3 a chunk is missing (the machine was given back
# between calls: carry all chunks again); 4 a checksum differs; 5 unpack,
# install or import failed. Every line it prints starts with "REASSEMBLE".
set -euo pipefail

say() { echo "REASSEMBLE $*"; }
die() { local code=$1; shift; say "FAIL: $*"; exit "$code"; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -n "${STAGE:-}" ]; then
  stage=$(cd "$STAGE" && pwd) || die 3 "STAGE=$STAGE is not a folder"
else
  case "$(basename "$here")" in
    chunk[0-9]*) stage=$(dirname "$here") ;;        # a copy inside .stage/chunkNN/
    .stage) stage=$here ;;                           # a copy in .stage/
    *) stage=$(cd "$here/../../../.." && pwd)/.stage ;;  # python/benchmarks/gpu/stage/ in the repo
  esac
fi
[ -d "$stage" ] || die 3 "no folder $stage (no chunk folder arrived?)"
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/dc-whl}
PY=${PYTHON:-python3}

# The manifests travel in every chunk folder; take the first one found.
sums=""
for d in "$stage" "$stage"/chunk*/; do
  if [ -f "$d/SHA256SUMS" ] && [ -f "$d/WHEELS.SHA256" ]; then sums=${d%/}; break; fi
done
[ -n "$sums" ] || die 3 "no SHA256SUMS/WHEELS.SHA256 under $stage (no chunk folder arrived?)"
nparts=$(grep -c '  chunk[0-9]*/bundle\.tar\.xz\.part[0-9]*$' "$sums/SHA256SUMS")
say "stage=$stage parts=$nparts site=$SITE python=$("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])') glibc=$(ldd --version 2>/dev/null | head -1 | grep -o '[0-9.]*$' || echo ?) (llguidance needs >= 2.31)"

missing=()
while read -r _ rel; do
  case "$rel" in chunk*/bundle.tar.xz.part*) [ -f "$stage/$rel" ] || missing+=("$rel") ;; esac
done < "$sums/SHA256SUMS"
if [ ${#missing[@]} -gt 0 ]; then
  present=$(cd "$stage" && ls -d chunk*/ 2>/dev/null | tr '\n' ' ')
  die 3 "missing ${missing[*]} (present: ${present:-none}); the machine keeps carried chunks only while warm: carry every chunk again, one call each, back to back"
fi

# 1) each part, then the whole bundle
(cd "$stage" && grep '  chunk[0-9]*/bundle\.tar\.xz\.part[0-9]*$' "$sums/SHA256SUMS" | sha256sum -c --quiet -) \
  || die 4 "a part's SHA-256 differs (a damaged or stale chunk: carry it again)"
rm -rf "$WORK" && mkdir -p "$WORK/whl"
cat $(grep -o 'chunk[0-9]*/bundle\.tar\.xz\.part[0-9]*$' "$sums/SHA256SUMS" | sort | sed "s|^|$stage/|") > "$WORK/bundle.tar.xz"
(cd "$WORK" && grep '  bundle\.tar\.xz$' "$sums/SHA256SUMS" | sha256sum -c --quiet -) || die 4 "the joined bundle's SHA-256 differs"
say "parts and bundle verified ($(du -m "$WORK/bundle.tar.xz" | cut -f1) MiB)"

# 2) unpack and check every wheel
if command -v xz >/dev/null 2>&1; then
  xz -dc "$WORK/bundle.tar.xz" | tar -xf - -C "$WORK/whl" || die 5 "xz/tar could not unpack the bundle"
else
  "$PY" - "$WORK/bundle.tar.xz" "$WORK/whl" <<'PYEOF' || die 5 "python lzma/tarfile could not unpack the bundle"
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2])
PYEOF
fi
rm -f "$WORK/bundle.tar.xz"
(cd "$WORK/whl" && sha256sum -c --quiet "$sums/WHEELS.SHA256") || die 4 "a wheel's SHA-256 differs"
nwhl=$(ls "$WORK"/whl/*.whl | wc -l)
say "$nwhl wheels verified"

# 3) install and import
t0=$(date +%s)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WORK"/whl/*.whl \
  || die 5 "pip install --target $SITE failed"
say "installed into $SITE in $(( $(date +%s) - t0 ))s"
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 "$PY" - <<'PYEOF' || die 5 "vLLM does not import from the installed set"
import importlib, sys
import torch, vllm
mods = ["vllm.v1.engine.async_llm", "vllm.engine.arg_utils", "vllm.v1.engine.core", "vllm.v1.worker.gpu_model_runner",
        "vllm.model_executor.models.llama", "vllm.v1.attention.backends.flash_attn", "vllm.vllm_flash_attn",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_connector", "vllm._C_stable_libtorch"]
for m in mods:
    importlib.import_module(m)
from vllm.vllm_flash_attn.flash_attn_interface import FA3_AVAILABLE, FA3_UNAVAILABLE_REASON
print(f"REASSEMBLE imported OK: vllm {vllm.__version__} from {vllm.__file__}; torch {torch.__version__}; "
      f"cuda available {torch.cuda.is_available()}; FA3 {FA3_AVAILABLE} {FA3_UNAVAILABLE_REASON or ''}")
PYEOF
rm -rf "$WORK"
say "OK: now export PYTHONPATH=$SITE VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1"
