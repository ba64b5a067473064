# The README's two commands: `make demo` (run the default job) and `make test` (run the tests).
# Both create or reuse .venv and install what is missing. An installed torch is kept: if the python3 that
# runs make already has torch, the venv sees it (--system-site-packages); otherwise TORCH_SPEC is installed
# (default: plain "torch", which gives a CUDA build on a GPU machine; CI pins the local CPU wheel with
# TORCH_SPEC=torch==2.13.0).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fedhop-installed

.PHONY: demo test test-unit test-gpu test-testbed lint bench reproduce reproduce-quick proto clean help fuzz

help:
	@echo "make demo   - run the default job (PS, edges, clients as separate processes) on bundled data"
	@echo "make test   - ruff + the whole test suite (except tests/testbed)"
	@echo "make test-unit - the unit tier only (no sockets, no processes; seconds): the inner loop"
	@echo "make test-gpu - the CUDA tests (tests/gpu): launch == simulate bit for bit, GPU spread, memory, transfers"
	@echo "make test-testbed - root + Docker: compose (v1, v2), swarm and namespace testbeds, the chaos soak (minutes)"
	@echo "make bench  - benchmarks (printed tables)"
	@echo "make fuzz   - fuzz the wire long: FEDHOP_FUZZ_EXAMPLES per property (default 5000), then atheris if installed"
	@echo "make reproduce / reproduce-quick - the paper reproductions (full / CI size)"

$(STAMP): pyproject.toml setup.py
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; fi
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fedhop launch

lint: $(STAMP)
	$(PY) -m ruff check .

# Two pytest-xdist workers (TEST_WORKERS=1: one process, no xdist); a file's tests stay in one worker (its module
# fixtures are built once); tests marked serial run alone (tests/conftest.py).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest tests --ignore=tests/testbed --ignore=tests/gpu $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# The inner loop: tests/unit, which opens no socket and starts no process (tests/conftest.py: the tiers).
test-unit: $(STAMP)
	$(PY) -m pytest -m unit

# The GPU tests (tests/gpu; each skips, saying why, where torch sees no CUDA device): `simulate` and `launch` on
# CUDA bit for bit with deterministic algorithms on (CUBLAS_WORKSPACE_CONFIG below, and
# torch.use_deterministic_algorithms in every process: tests/gpu/gpuutil.py), the spread of the processes over the
# visible GPUs, the memory of a GPU client, and transfers from/to device memory (figures printed; -s shows them).
test-gpu: $(STAMP)
	CUBLAS_WORKSPACE_CONFIG=:4096:8 $(PY) -m pytest tests/gpu -v -s -rs

# Root only. Installs Docker, Compose v1/v2, debootstrap, nftables and Chromium if missing, starts dockerd,
# builds the base and fedhop images locally (no registry needed), then runs the compose, swarm, namespace and
# browser tests.
# Each set-up step prints how long it took; then pytest prints every test's duration.
test-testbed: $(STAMP)
	$(PY) -m tests.testbed.docker_env
	$(PY) -m pytest tests/testbed -s --durations=0

bench: $(STAMP)
	$(PY) tests/bench/bench_codec.py
	$(PY) tests/bench/bench_transfer.py

# The property tests (wire, session, web API, spec loader) with many examples (CI runs them with a few dozen),
# then coverage-guided fuzzing of the wire with atheris where it is installed (pip install atheris;
# FEDHOP_FUZZ_RUNS inputs).
FEDHOP_FUZZ_EXAMPLES ?= 5000
FEDHOP_FUZZ_RUNS ?= 200000
fuzz: $(STAMP)
	FEDHOP_FUZZ_EXAMPLES=$(FEDHOP_FUZZ_EXAMPLES) $(PY) -m pytest tests/unit/test_fuzz_wire.py tests/unit/test_fuzz_session.py tests/unit/test_fuzz_web.py tests/unit/test_fuzz_spec.py --hypothesis-show-statistics
	@if $(PY) -c "import atheris" 2>/dev/null; then $(PY) tests/fuzz/atheris_wire.py --seeds build/fuzz-corpus && \
	  $(PY) tests/fuzz/atheris_wire.py build/fuzz-corpus -runs=$(FEDHOP_FUZZ_RUNS); \
	else echo "make fuzz: atheris is not installed, so coverage-guided fuzzing was skipped (pip install atheris)"; fi

reproduce: $(STAMP)
	$(VENV)/bin/fedhop reproduce all

reproduce-quick: $(STAMP)
	$(VENV)/bin/fedhop reproduce all --quick

proto: $(STAMP)
	$(PY) proto/generate.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
