# EPU — the two commands a new user needs: `make run` and `make test`.
# Each does its own set-up: a virtualenv with the packages, and (for tests) the system
# services the suite talks to (RabbitMQ, PostgreSQL, Slurm) and promtool (the alert rules' tests),
# installed with apt-get as root.

# The interpreter: the distribution's /usr/bin/python3 when it is 3.11 or newer (Debian builds it
# with optimizations and a static libpython), else the first python3 on PATH. A pyenv or source
# build without --enable-optimizations runs EPU ~18 % slower (docs/performance.md, "The interpreter").
ifndef PYTHON
PYTHON := $(shell /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo /usr/bin/python3 || echo python3)
endif
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-demo
PYTEST_ARGS ?=

.PHONY: run test test-fast lint bench bench-compare e2e sim venv services clean help

help:
	@echo "make run    — the embedded demo: all services in one process, simulated cluster and cloud"
	@echo "make test   — the whole test suite (sets up venv, RabbitMQ, PostgreSQL, Slurm; ~31 min on 2 cores)"
	@echo "make test-fast — the suites that need no RabbitMQ, PostgreSQL or Slurm (venv only)"
	@echo "make lint   — ruff"
	@echo "make bench  — benchmarks in bench/ (figures printed; see docs/performance.md)"
	@echo "make bench-compare BASE=DIR — the production benches side by side with another tree (its own .venv)"
	@echo "make e2e    — the real thing on one machine: an elastic Slurm cluster driven by all services"
	@echo "make sim    — the fault simulator over many seeds (SIM_SEEDS per scenario); invariant counts"

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null || { echo "epu: need Python >= 3.11: sudo apt-get install -y python3 python3-venv"; exit 1; }
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { \
	  if [ "$$(id -u)" -eq 0 ]; then apt-get update -qq && apt-get install -y -qq python3-venv; \
	  else echo "epu: need the venv module: sudo apt-get install -y python3-venv"; exit 1; fi; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The demo needs the services, not the test tools: `make run` installs the 'demo' extra only.
$(RUN_STAMP): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/pip install -q -e '.[demo]'
	@touch $(RUN_STAMP)

# Tests, lint and benchmarks need everything ('dev' includes every role's extra).
$(STAMP): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP) $(RUN_STAMP)

venv: $(STAMP)

services:
	@bash scripts/ensure-services.sh

run: $(RUN_STAMP)
	$(BIN)/epu demo $(ARGS)

# Everything, the real-Slurm end-to-end scenario and its fault tests (tests/e2e) included.
test: $(STAMP) services
	@if [ -x scripts/ensure-slurm.sh ]; then bash scripts/ensure-slurm.sh; fi
	@bash scripts/ensure-promtool.sh
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The suites that need no system service or tool: every test not marked rabbitmq, postgres, slurm,
# e2e, cluster or promtool (tests/conftest.py marks a test by the service fixtures it takes). EPU_TEST_OFFLINE=1
# makes a test that reaches for RabbitMQ or PostgreSQL anyway fail with the reason, and the
# addresses point nowhere, so the run proves it needs neither.
FAST_MARKERS := not rabbitmq and not postgres and not slurm and not e2e and not cluster and not promtool
test-fast: $(STAMP)
	EPU_TEST_OFFLINE=1 EPU_TEST_RABBIT_HOST=127.0.0.1:1 EPU_TEST_PG_URL=postgresql://postgres@127.0.0.1:1 \
	  $(BIN)/python -m pytest -q -p no:cacheprovider -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

# Every benchmark with --json into bench/results/<name>.json, then docs/performance.md's tables
# rewritten from them (bench/report.py). Arguments sized so the whole run stays under 10 minutes
# on the 2-core project machine; `make bench BENCHES="sensor packing"` runs a subset. A bench that
# fails stops it with exit 1: bench_sensor.py fails when the 10,000-node snapshot passes 1 MiB
# (its goal; EPU_BENCH_SNAPSHOT_MAX_MIB=0.01 to see the guard fire).
BENCHES ?= sensor packing decision decision_scale reaction slurm_native reconcile provisioner provisioner_scale messaging sim simulate ctxbroker
BENCH_ARGS_sensor = --repeats 3
BENCH_ARGS_packing = --repeat 5 --optimality 2000
BENCH_ARGS_decision = --repeat 30 --store
BENCH_SCRIPT_decision_scale = decision
BENCH_ARGS_decision_scale = --scale-only
BENCH_ARGS_reaction = --trials 200 --baseline-trials 10
BENCH_ARGS_slurm_native = --repeat 200 --live 200 --nodes 3000 --batch 50 --sim-jobs 600
BENCH_ARGS_reconcile = --nodes 50 500 --repeat 30
BENCH_ARGS_provisioner = --launches 1000
BENCH_ARGS_provisioner_scale = --nodes 1000 10000 --repeat 10
BENCH_ARGS_messaging = --no-cluster
BENCH_ARGS_sim = --seeds 2
BENCH_ARGS_simulate = 1 1
BENCH_ARGS_ctxbroker =
define run_bench
echo "== bench/bench_$(or $(BENCH_SCRIPT_$(1)),$(1)).py $(BENCH_ARGS_$(1)) --json"; start=$$(date +%s); \
$(BIN)/python bench/bench_$(or $(BENCH_SCRIPT_$(1)),$(1)).py $(BENCH_ARGS_$(1)) --json > bench/results/$(1).json.tmp \
  && mv bench/results/$(1).json.tmp bench/results/$(1).json \
  && echo "   $$(( $$(date +%s) - start )) s" || exit 1;
endef

bench: $(STAMP) services
	@mkdir -p bench/results
	@$(foreach b,$(BENCHES),$(call run_bench,$(b)))
	$(BIN)/python bench/report.py

# The production figures side by side with another tree (bench/side_by_side.py): each bench of
# BENCH_COMPARE, with its `make bench` arguments, run alternately in BASE (a tree with its own
# `make venv`) and this tree, SBS_ARGS (default 3 pairs, +10 %) passed on; a table per bench.
# Exit 1 when a figure is over the threshold, 2 on bad input or a failed run.
BENCH_COMPARE ?= sensor decision_scale
SBS_ARGS ?=
bench-compare: $(STAMP)
	@test -n "$(BASE)" || { echo "usage: make bench-compare BASE=DIR [BENCH_COMPARE='sensor decision_scale'] [SBS_ARGS=...]"; exit 2; }
	@test -z "$(filter-out $(BENCHES),$(BENCH_COMPARE))" || { \
	  echo "bench-compare: unknown bench $(filter-out $(BENCHES),$(BENCH_COMPARE)) (one of: $(BENCHES))"; exit 2; }
	@rc=0; $(foreach b,$(BENCH_COMPARE),echo "== $(b)"; $(BIN)/python bench/side_by_side.py --base $(BASE) $(SBS_ARGS) \
	  $(or $(BENCH_SCRIPT_$(b)),$(b)) $(BENCH_ARGS_$(b)) || { r=$$?; [ $$r -gt $$rc ] && rc=$$r; };) exit $$rc

e2e: $(STAMP) services
	@if [ -x scripts/ensure-slurm.sh ]; then bash scripts/ensure-slurm.sh; fi
	$(BIN)/python -m pytest -q -p no:cacheprovider -m e2e $(PYTEST_ARGS)

# The deterministic fault simulator (docs/simulation.md): every scenario over SIM_SEEDS seeds,
# spread over SIM_JOBS processes; prints runs, simulated hours and invariant violations per
# scenario, and the replay command of any failing seed. `make test` runs a small fixed set.
SIM_SEEDS ?= 40
SIM_START ?= 1001
SIM_JOBS  ?= $(shell nproc 2>/dev/null || echo 1)
sim: $(STAMP)
	$(BIN)/epu sim --seeds $(SIM_SEEDS) --seed-start $(SIM_START) --jobs $(SIM_JOBS) $(SIM_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache results
