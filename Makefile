# EPU — the two commands a new user needs: `make run` and `make test`.
# Each does its own set-up: a virtualenv with the packages, and (for tests) the system
# services the suite talks to (RabbitMQ, PostgreSQL, Slurm), installed with apt-get as root.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run test lint bench e2e venv services clean help

help:
	@echo "make run    — the embedded demo: all services in one process, simulated cluster and cloud"
	@echo "make test   — the whole test suite (sets up venv, RabbitMQ, PostgreSQL, Slurm)"
	@echo "make lint   — ruff"
	@echo "make bench  — benchmarks in bench/ (figures printed; see docs/performance.md)"
	@echo "make e2e    — the real thing on one machine: an elastic Slurm cluster driven by all services"

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "epu: need Python >= 3.11: sudo apt-get install -y python3 python3-venv"; exit 1; }
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { \
	  if [ "$$(id -u)" -eq 0 ]; then apt-get update -qq && apt-get install -y -qq python3-venv; \
	  else echo "epu: need the venv module: sudo apt-get install -y python3-venv"; exit 1; fi; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

services:
	@bash scripts/ensure-services.sh

run: $(STAMP)
	$(BIN)/epu demo $(ARGS)

# Everything, the real-Slurm end-to-end scenario and its fault tests (tests/e2e) included.
test: $(STAMP) services
	@if [ -x scripts/ensure-slurm.sh ]; then bash scripts/ensure-slurm.sh; fi
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP) services
	@for f in bench/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

e2e: $(STAMP) services
	@if [ -x scripts/ensure-slurm.sh ]; then bash scripts/ensure-slurm.sh; fi
	$(BIN)/python -m pytest -q -p no:cacheprovider -m e2e $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache results
