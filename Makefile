# Everyday targets. `make demo` and `make test` do all set-up themselves on a
# fresh machine that has Go, a C compiler and Python 3.9+ with its headers.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
export PATH := $(PATH):/usr/local/go/bin
GOTEST_FLAGS ?= -race -count=1 -timeout 15m
PYTEST_FLAGS ?=

.PHONY: all setup build demo demo-context test test-go test-py test-vllm bench-vllm vet lint bench bench-go bench-py soak fuzz clean

all: build

# A virtualenv with the package installed in editable mode (its library is
# built in place by build.py, the package's build backend) plus test tools.
$(VENV)/.installed: pyproject.toml build.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

# Rebuilds the shared library when any Go or C source changed.
build: setup
	$(PY) build.py

# The main job: the embedded stack (NATS, frontend, prefill + decode mock
# workers), requests through the OpenAI API cancelled at different phases.
demo: build
	$(PY) -m dynamo_ctx.demo

demo-context: build
	$(PY) -m dynamo_ctx.demo_context

# The test library's hook (-tags dc_selftest) is vetted too.
vet:
	go vet ./...
	go vet -tags dc_selftest ./go/native

# Go: vet and gofmt. Python: ruff (rules and line length in pyproject.toml)
# and mypy (strict on the public modules; pyproject.toml).
lint: vet setup
	@out=$$(gofmt -l go); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(VENV)/bin/ruff check python
	$(VENV)/bin/mypy

# The leader-loss test is built only without the race detector (see its
# file): it runs in a second pass, without -race.
test-go:
	go test $(GOTEST_FLAGS) ./...
	go test -count=1 -timeout 15m -run '^TestStreamLeaderLoss$$' ./go/cmd/scalesim

# The panic-recovery tests load the test library (build.py --selftest: the
# shipped library plus its self-test hook, in build/selftest); their fixture
# builds it too, this only shows a failure first.
test-py: build
	$(PY) build.py --selftest
	$(PY) -m pytest $(PYTEST_FLAGS)

test: lint test-go test-py

# Not in `make test` nor CI: vLLM itself, without a GPU. First the real engine:
# vLLM built for CPU in .venv-vllm-cpu (built once, about 6 GB), a random-weight
# Llama with Llama 3's tokenizer made locally, and the mission's end-to-end tests
# on it (python/tests/vllm_cpu/run.sh: aggregated and disaggregated, disconnects,
# migration under SIGKILL, engine death, deadline, drain, admission, text identity
# with vLLM's own server; then the mock engine checked against it). Then the
# contract: for each version in python/tests/vllm_contract/versions.txt (or
# VLLM="0.33.0 ..."), a side virtualenv .venv-vllm-<version> (built once, about
# 2-3 minutes and 8-10 GB each, then reused) runs python/tests/vllm_contract with
# VLLM_TARGET_DEVICE=cpu: the handlers' engine calls bind to vLLM's signatures,
# the mock's surface is vLLM's, the worker parses vLLM's engine arguments.
# The side venvs use the library built here in place (no editable install).
VLLM ?=
test-vllm: build
	python/tests/vllm_cpu/run.sh
	python/tests/vllm_contract/make_env.sh $(VLLM)

# Not in `make bench`: the stack on vLLM (CPU) side by side with vLLM's own
# server, each alone in a private network namespace (about 20 minutes).
bench-vllm: build
	python/tests/vllm_cpu/make_env.sh >/dev/null
	.venv-vllm-cpu/bin/python python/benchmarks/bench_vllm_cpu.py

bench-go:
	go test -run '^$$' -bench . -benchmem ./go/...

bench-py: build
	$(PY) python/benchmarks/bench_context.py
	$(PY) python/benchmarks/bench_tokenize.py
	$(PY) python/benchmarks/bench_plane.py
	$(PY) python/benchmarks/bench_frontend.py
	ulimit -n 8192 2>/dev/null; $(PY) python/benchmarks/bench_frontend_memory.py
	$(PY) python/benchmarks/bench_vs_dynamo.py
	$(PY) python/benchmarks/bench_connections.py
	ulimit -n 8192 2>/dev/null; $(PY) python/benchmarks/bench_load.py
	ulimit -n 8192 2>/dev/null; $(PY) python/benchmarks/bench_deadlines.py
	ulimit -n 8192 2>/dev/null; $(PY) python/benchmarks/bench_drain.py

bench: bench-go bench-py

# Not in CI: 2,000 streams, disconnects, time-outs and a worker SIGKILLed; prints its figures.
soak: build
	$(PY) python/benchmarks/soak.py

# Runs each fuzz target for a while (plain `go test` already runs the seed corpora).
FUZZTIME ?= 30s
fuzz:
	@for pkg in $$(go list ./go/...); do \
	  for t in $$(go test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    go test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

clean:
	rm -rf $(VENV) dist build/selftest python/dynamo_ctx/_native.abi3.so python/dynamo_ctx/include
