#!/usr/bin/env bash
# Side environments for the vLLM contract tests (`make test-vllm`; not part of
# `make test`, and CI does not run it).
#
# For each vLLM version (the arguments, else the lines of
# python/tests/vllm_contract/versions.txt) this builds, once, a virtualenv at
# .venv-vllm-<version> in the repository root holding vllm==<version> (with its CUDA torch from PyPI: no GPU is needed to
# import it) and pytest, and makes this package importable there through a .pth
# file that points at python/: the already-built python/dynamo_ctx/_native.abi3.so
# is used in place, so no Go toolchain is needed (`pip install -e .` would run
# build.py, which rebuilds the library with Go whenever a Go source is newer).
# Then it runs python/tests/vllm_contract there with VLLM_TARGET_DEVICE=cpu.
#
# A line of versions.txt may name requirements after the version that replace
# vLLM's own pins of those packages ("0.34.0 flashinfer-python==0.7.4": a pin
# that PyPI cannot satisfy); then vLLM is installed without its dependencies,
# which are installed next from its metadata with those replaced.
#
# Usage: make_env.sh [--no-test] [VERSION...]   (no VERSION: every line of versions.txt)
# Environment: PYTHON (interpreter for new venvs, default python3), PYTEST_FLAGS.
# The venvs are kept and reused; delete one to rebuild it.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
HERE="$ROOT/python/tests/vllm_contract"
PYTHON="${PYTHON:-python3}"
RUN_TESTS=1
if [ "${1:-}" = "--no-test" ]; then RUN_TESTS=0; shift; fi

# One entry a version: "VERSION [OVERRIDE...]" (a VERSION given takes its line's overrides).
mapfile -t ALL < <(sed -e 's/#.*//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$HERE/versions.txt" | grep -v '^$')
if [ $# -gt 0 ]; then
  LINES=()
  for v in "$@"; do
    line="$v"
    for l in "${ALL[@]}"; do
      if [ "${l%% *}" = "$v" ]; then line="$l"; fi
    done
    LINES+=("$line")
  done
else
  LINES=("${ALL[@]}")
fi

if [ ! -e "$ROOT/python/dynamo_ctx/_native.abi3.so" ]; then
  echo "make_env.sh: python/dynamo_ctx/_native.abi3.so is missing: run 'make build' first" >&2
  exit 2
fi

# vLLM's requirements (no extras) from its installed metadata, one a line,
# with those named in the arguments replaced by them.
VLLM_REQUIREMENTS='
import re, sys
from importlib.metadata import requires
name = lambda r: re.split(r"[\s\[<>=!~;(]", r, maxsplit=1)[0].lower().replace("_", "-")
over = {name(o): o for o in sys.argv[1:]}
for r in requires("vllm") or []:
    if "extra ==" in r:
        continue
    print(over.pop(name(r), r))
print("\n".join(over.values()))
'

build_env() {  # venv version [override...]
  local venv="$1" v="$2"
  shift 2
  local stamp="$venv/.installed-vllm-$v"
  [ -e "$stamp" ] && return 0
  echo "== building $venv (vllm==$v${*:+, overriding: $*})"
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv" || return 1
  "$venv/bin/python" -m pip install --quiet --upgrade pip || return 1
  # pytest, and the package's own runtime dependencies (pyproject.toml) besides vLLM's.
  local ours=(pytest "prometheus_client>=0.17" "uvloop>=0.18")
  if [ $# -eq 0 ]; then
    "$venv/bin/python" -m pip install --quiet "vllm==$v" "${ours[@]}" || return 1
  else
    "$venv/bin/python" -m pip install --quiet --no-deps "vllm==$v" || return 1
    "$venv/bin/python" -c "$VLLM_REQUIREMENTS" "$@" > "$venv/vllm-requirements.txt" || return 1
    "$venv/bin/python" -m pip install --quiet -r "$venv/vllm-requirements.txt" "${ours[@]}" || return 1
  fi
  local site
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || return 1
  echo "$ROOT/python" > "$site/dynamo_ctx_src.pth" || return 1
  touch "$stamp"
}

status=0
summary=()
for line in "${LINES[@]}"; do
  read -r -a words <<< "$line"
  v="${words[0]}"
  venv="$ROOT/.venv-vllm-$v"
  t0=$(date +%s)
  if ! build_env "$venv" "${words[@]}"; then
    summary+=("vllm $v: environment build FAILED")
    status=1
    continue
  fi
  t1=$(date +%s)
  result="not run"
  if [ "$RUN_TESTS" = 1 ]; then
    echo "== vllm $v: contract tests"
    # shellcheck disable=SC2086
    if (cd "$ROOT" && VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -m pytest -p no:cacheprovider ${PYTEST_FLAGS:-} python/tests/vllm_contract); then
      result="passed"
    else
      result="FAILED"
      status=1
    fi
  fi
  t2=$(date +%s)
  size=$(du -sh "$venv" 2>/dev/null | cut -f1)
  summary+=("vllm $v: tests $result (build $((t1 - t0))s, tests $((t2 - t1))s, venv $size)")
done

echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
