# The two commands the README starts with. Each does its own set-up.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: run test lint typecheck pytest bench bench-quick soak mutants clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[orientation,ocr]"
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[orientation,ocr,dev]"
	touch $@ $(STAMP_RUN)

run: $(STAMP_RUN)
	$(BIN)/inferchain run recipes/ocr --output out/ocr --overwrite

test: $(STAMP_DEV) lint typecheck pytest gate

lint: $(STAMP_DEV)
	$(BIN)/ruff check inferchain tests benchmarks recipes tools
	$(BIN)/ruff format --check inferchain tests benchmarks recipes tools

typecheck: $(STAMP_DEV)
	$(BIN)/mypy

pytest: $(STAMP_DEV)
	$(BIN)/python -m pytest -q

# the core benchmark in quick mode, failing below loose floors (a regression gate)
gate: $(STAMP_DEV)
	cd benchmarks && ../$(BIN)/python bench_core.py --quick --gate

BENCHMARKS := bench_core bench_memory bench_startup bench_ocr bench_orientation bench_padding bench_ray bench_acl_streams bench_acl_pipeline bench_handover bench_shards bench_vad bench_romanize

bench: $(STAMP_DEV)
	for b in $(BENCHMARKS); do $(BIN)/python benchmarks/$$b.py $(BENCH_ARGS) || exit 1; done

bench-quick: BENCH_ARGS = --quick
bench-quick: bench

# single mutations of the acl backend that a card would punish: each must fail the acl tests
mutants: $(STAMP_DEV)
	$(BIN)/python tools/mutants.py

soak: $(STAMP_DEV)
	$(BIN)/python -m inferchain.testing.soak --seconds 600

clean:
	rm -rf $(VENV) out .mypy_cache .pytest_cache .ruff_cache
