# Two commands do everything on a fresh machine:
#   make demo   set up .venv, then search the built-in demo model (offline, CPU or GPU)
#   make test   set up .venv, then run the tests
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,postgres,serve]" -c constraints.txt
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/autotune search --model demo --trials 8

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
