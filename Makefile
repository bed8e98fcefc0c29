# Each target sets itself up: a fresh machine needs only python3 (>= 3.10) and make.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.specbatch-installed
PROFILE ?= loadtest/profiles/smoke.yaml
# NVIDIA AIPerf (Python >= 3.11) lives in its own virtualenv: its dependencies are many
# and pinned, and the project's environment stays as it is.
AIPERF_VENV ?= .venv-aiperf
AIPERF_STAMP := $(AIPERF_VENV)/.aiperf-installed

.PHONY: setup models serve test fuzz lint bench loadtest soak chaos aiperf clean \
	production-shapes test-production-shapes bench-production-shapes

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch, pinned: an unpinned torch pulls gigabytes of CUDA wheels.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

models: setup
	$(BIN)/specbatch build-models

# Random weights with the production pair's shapes (Qwen3-0.6B exact, Qwen3-8B with 4 of
# its 36 layers), sharded bf16 safetensors, a tokenizer of Qwen3's size: about 5 GB.
production-shapes: setup
	$(BIN)/specbatch build-models --production-shapes

serve: setup
	$(BIN)/specbatch serve

test: setup
	$(BIN)/ruff check .
	$(BIN)/pytest -q

# Not part of `test`: loads the production-shaped pair (5 GB) and decodes it in bf16.
test-production-shapes: production-shapes
	SPECBATCH_PRODUCTION_SHAPES=1 $(BIN)/pytest -q tests/models/test_production_shapes.py

# The property-based fuzz of the HTTP and gRPC inputs at length: fresh random examples each run.
FUZZ_EXAMPLES ?= 2000
fuzz: setup
	SPECBATCH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) SPECBATCH_FUZZ_RANDOM=1 $(BIN)/pytest -q tests/integration/test_fuzz.py

lint: setup
	$(BIN)/ruff check .

# PROFILE=loadtest/profiles/<name>.yaml; HOST=h:8000 GRPC_HOST=h:8001 test a running server instead.
loadtest: setup
	$(BIN)/python -m specbatch.loadtest --profile $(PROFILE) --out results/loadtest/$(basename $(notdir $(PROFILE))) \
		$(if $(HOST),--host $(HOST)) $(if $(GRPC_HOST),--grpc-host $(GRPC_HOST))

# 10 minutes at 0.8x capacity, mixed workload with cancellations and deadlines: lost/duplicate answers, RSS, queue.
soak: setup
	$(BIN)/python scripts/soak.py --out results/soak

# Each kind of process killed (and one instance hung) under the mixed workload at 70 % of
# capacity, under `specbatch serve` and as deploy/ runs tritonserver: what clients saw.
chaos: setup
	$(BIN)/python scripts/chaos.py --out results/chaos

bench: setup
	$(BIN)/python scripts/bench_specdec.py --quick --out results/bench_specdec.json
	$(BIN)/python scripts/bench_continuous.py --quick --out results/bench_continuous.json
	$(BIN)/python scripts/bench_host_memory.py --rounds 2 --out results/bench_host_memory.json
	$(BIN)/python scripts/bench_prefix.py --quick --out results/bench_prefix.json
	$(BIN)/python scripts/bench_prefix_serving.py --quick --out results/bench_prefix_serving.json
	$(BIN)/python scripts/bench_sampling_options.py --out results/bench_sampling_options.json --plot results/bench_sampling_options.png
	$(BIN)/python scripts/bench_lookahead.py --quick --out results/bench_lookahead.json
	$(BIN)/python scripts/bench_gpu.py --device cpu --quick --out results/bench_gpu.json
	$(BIN)/python scripts/bench_routing.py --out results/bench_routing.json
	$(BIN)/python -m specbatch.scheduling.simulate all --out results/scheduling
	$(BIN)/python scripts/bench_multibin.py --quick --out results/bench_multibin.json --figure results/multibin_live.png
	$(BIN)/python scripts/bench_policies.py --quick --out results/bench_policies.json --plot-dir results
	$(BIN)/python scripts/bench_predict.py --policies results/bench_policies.json --out results/bench_predict.json --plot results/bench_predict.png
	$(BIN)/python scripts/bench_slow_machine.py --predict results/bench_predict.json --policies results/bench_policies.json --out results/bench_slow_machine.json --plot results/bench_slow_machine.png
	$(BIN)/python scripts/bench_serving_cpu.py --out results/serving_cpu.json

bench-production-shapes: production-shapes
	$(BIN)/python scripts/bench_production_shapes.py --out results/bench_production_shapes.json

$(AIPERF_STAMP):
	$(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install --quiet --upgrade pip
	$(AIPERF_VENV)/bin/pip install --quiet aiperf==0.13.0
	touch $(AIPERF_STAMP)

# URL=http://host:9000 benchmarks a running OpenAI front instead of starting one here.
aiperf: setup $(AIPERF_STAMP)
	$(BIN)/python scripts/aiperf_bench.py --aiperf $(AIPERF_VENV)/bin/aiperf --out results/aiperf \
		$(if $(URL),--url $(URL))

clean:
	rm -rf $(VENV) $(AIPERF_VENV) .models results .pytest_cache
