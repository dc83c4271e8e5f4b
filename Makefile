# Two commands do everything on a fresh machine:
#   make demo   set up .venv, then search the built-in demo model (offline, CPU or GPU)
#   make test   set up .venv, then run the tests
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint conformance conformance-floor conformance-floor-full floor-cache

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,postgres,serve,quant,s3,eval]" -c constraints.txt
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/autotune search --model demo --trials 8

# One autotune cache (the demo model and its draft, reference outputs) for the tests and the pinned conformance run:
# the demo model takes about 3 minutes to train on 2 cores, so it is built once.
CACHE := $(CURDIR)/.cache/autotune

# Two test processes, one per core (-n 2), each test module in one of them (its module fixtures: a Slurm cluster, four
# nights); every torch process with one thread: two with a thread per core each slow each other several times over.
# Every test's time stays in .cache/test-times.xml (JUnit XML): per file, what a run spent where.
test: $(STAMP)
	AUTOTUNE_TEST_CACHE_DIR=$(CACHE) OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25 \
		--junitxml=.cache/test-times.xml

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# Every knob value the cpu profile runs, through the real worker, on the pinned transformers and on the lowest one
# pyproject.toml claims (its own venv), held to the outcomes in benchmarks/conformance/expected-<version>.yaml.
FLOOR_VENV := .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.installed
FLOOR_CACHE := $(CURDIR)/.cache/conformance-floor
# The floor runs the cases whose path depends on the transformers version, and every case when a source that decides
# what a knob value does differs from the last full floor run that passed: make conformance-floor-full keeps their
# checksums in FLOOR_RECORD (commit it).
FLOOR_TRANSFORMERS := $(shell sed -n 's/^transformers==//p' constraints-floor.txt)
FLOOR_SOURCES := autotune/space/rules.py autotune/worker/compat.py autotune/worker/hub_kernels.py autotune/worker/decode_loops.py \
	autotune/worker/prefix_reuse.py autotune/worker/replay.py \
	autotune/worker/decode_steps.py autotune/worker/fused_step.py \
	autotune/worker/loading.py autotune/worker/hooks.py autotune/worker/generation.py autotune/worker/generation_trial.py \
	$(sort $(wildcard autotune/space/knobs/*.py)) autotune/space/default.yaml autotune/cli/flags.py constraints-floor.txt benchmarks/conformance/conformance.py \
	autotune/cli/workload_flags.py autotune/cli/traffic_flags.py benchmarks/conformance/expected-$(FLOOR_TRANSFORMERS).yaml
FLOOR_RECORD := benchmarks/conformance/full-floor.sha256

$(FLOOR_STAMP): pyproject.toml constraints-floor.txt
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install -q --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install -q "$(TORCH)"
	$(FLOOR_VENV)/bin/python -m pip install -q -e ".[quant]" -c constraints-floor.txt
	touch $(FLOOR_STAMP)

conformance: $(STAMP)
	AUTOTUNE_CACHE_DIR=$(CACHE) $(BIN)/python benchmarks/conformance/conformance.py

# The demo model the tests built, when they did (its own cache otherwise: reference outputs are per version).
floor-cache:
	mkdir -p $(FLOOR_CACHE)
	if [ -d $(CACHE)/models ]; then cp -rn $(CACHE)/models $(FLOOR_CACHE)/; fi

conformance-floor: $(FLOOR_STAMP) floor-cache
	@if sha256sum $(FLOOR_SOURCES) 2>/dev/null | cmp -s - $(FLOOR_RECORD); then cases=version-dependent; else \
	  echo "conformance-floor: every case runs: the sources differ from the last full floor run ($(FLOOR_RECORD)):"; \
	  sha256sum --check --quiet $(FLOOR_RECORD) 2>&1 | sed 's/^/  /'; cases=all; fi; \
	echo "AUTOTUNE_CACHE_DIR=$(FLOOR_CACHE) $(FLOOR_VENV)/bin/python benchmarks/conformance/conformance.py --cases $$cases"; \
	AUTOTUNE_CACHE_DIR=$(FLOOR_CACHE) $(FLOOR_VENV)/bin/python benchmarks/conformance/conformance.py --cases $$cases

# Every case on the floor; when all are as expected, records the sources' checksums (commit FLOOR_RECORD).
conformance-floor-full: $(FLOOR_STAMP) floor-cache
	AUTOTUNE_CACHE_DIR=$(FLOOR_CACHE) $(FLOOR_VENV)/bin/python benchmarks/conformance/conformance.py --cases all
	sha256sum $(FLOOR_SOURCES) > $(FLOOR_RECORD)
