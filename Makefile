# Two commands do everything on a fresh machine:
#   make demo   set up .venv, then search the built-in demo model (offline, CPU or GPU)
#   make test   set up .venv, then run the tests
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint conformance conformance-floor

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,postgres,serve,quant,s3]" -c constraints.txt
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/autotune search --model demo --trials 8

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# Every knob value the cpu profile runs, through the real worker, on the pinned transformers and on
# the lowest one pyproject.toml claims (its own venv): each must end ok or unsupported.
FLOOR_VENV := .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.installed

$(FLOOR_STAMP): pyproject.toml constraints-floor.txt
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install -q --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install -q "$(TORCH)"
	$(FLOOR_VENV)/bin/python -m pip install -q -e ".[quant]" -c constraints-floor.txt
	touch $(FLOOR_STAMP)

conformance: $(STAMP)
	AUTOTUNE_CACHE_DIR=$(CURDIR)/.cache/conformance-pinned $(BIN)/python benchmarks/conformance.py

conformance-floor: $(FLOOR_STAMP)
	AUTOTUNE_CACHE_DIR=$(CURDIR)/.cache/conformance-floor $(FLOOR_VENV)/bin/python benchmarks/conformance.py
