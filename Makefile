# Two set-up commands on a fresh machine with only python3:
#   make demo   — create .venv if missing, install, run the main job
#   make test   — create/update .venv, run the whole suite (unit, integration, e2e, benchmarks)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.grid-installed

.PHONY: demo test bench check soak lint engine browser etcd venv native clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# The planner compiled to C extensions by mypyc (about a minute; a no-op when a build of the
# current grid_core sources exists in .venv/grid-native). Plans are identical either way; the
# native build is 1.6-2.2x faster. Without it (or after an edit) the planner runs
# interpreted, as `grid bench plan` reports. It needs a C compiler and Python's headers; when
# the build fails its error is shown and Grid still runs (interpreted), but `make test` fails
# its native-build test. See docs/planner.md, "Native build".
native: venv
	@$(BIN)/python -m grid_core.system.native_build || \
	  echo "grid: the planner will run interpreted (plans are the same, about half as fast)"

# Build llama-server once (cached in the user cache, keyed by version); later runs reuse it.
engine: venv
	$(BIN)/grid engine install llama.cpp

# The main job: a 4-host logical fleet of real llama-server engines, the self-checking demo
# and its report, then a clean stop. KEEP=1 leaves the fleet running (stop: grid test stop).
# PORT / ENGINE_PORT_BASE move the fleet's API and engine ports when the defaults are taken.
PORT             ?= 22100
ENGINE_PORT_BASE ?= 22200
demo: engine native
	$(BIN)/grid test start --machines 4 --port $(PORT) --engine-port-base $(ENGINE_PORT_BASE)
	@status=0; $(BIN)/grid test demo || status=$$?; \
	if [ -z "$(KEEP)" ]; then $(BIN)/grid test stop || status=$$?; \
	else echo "grid: the fleet keeps running (KEEP=1); try '$(BIN)/grid test status'," \
	  "'$(BIN)/grid chat -m tiny-general.gguf hello --grid http://127.0.0.1:$(PORT)'," \
	  "and stop it with '$(BIN)/grid test stop'"; fi; \
	exit $$status

# Debian's Chromium and its chromedriver for the dashboard's browser test. Installed when missing
# and this runs as root with apt (CI does); otherwise the test fails with this same hint.
CHROMIUM       ?= /usr/bin/chromium
CHROMEDRIVER   ?= /usr/bin/chromedriver
browser:
	@if [ -x $(CHROMIUM) ] && [ -x $(CHROMEDRIVER) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "grid: installing Debian's chromium and chromium-driver for the browser test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    chromium chromium-driver >/dev/null; \
	else echo "grid: the browser test needs 'apt-get install chromium chromium-driver' (as root)"; fi

# Debian's etcd server for the highly available control-plane tests (tests start their own
# etcd on free loopback ports with a temporary data directory). Installed when missing and this
# runs as root with apt (CI does); otherwise those tests fail with this same hint.
ETCD           ?= /usr/bin/etcd
etcd:
	@if [ -x $(ETCD) ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "grid: installing Debian's etcd-server for the etcd state-store tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends etcd-server >/dev/null; \
	else echo "grid: the etcd state-store tests need 'apt-get install etcd-server' (as root)"; fi

# The suite in three phases, all always run (the exit status is the first failure's):
# 1. unit and integration tests on PYTEST_WORKERS pytest-xdist workers;
# 2. e2e tests on E2E_WORKERS workers, one test module per worker at a time (--dist loadfile:
#    a module's fleet or namespace lab never shares a worker);
# 3. benchmarks alone, one after another, so the numbers they print are not another test's
#    load.
# Most of a test's time here is spent waiting (for a server or engine to start, a heartbeat,
# a status poll), not computing, so more workers than cores finish sooner: twice the cores
# for phase 1 (at most 16, the test port plan's limit). On two cores that measured 3 min 6 s
# instead of 4 min 52 s for phase 1, under the same background load. The e2e tier gets one
# worker per core (at most 4): it took 8 min 15 s on two workers against 14 min 22 s one at a
# time; on three workers it was faster again (5 min 43 s) but in one fresh-clone run of four
# five e2e tests timed out (a demo phase, a drain-in-flight, a preemption warm-back).
# Phase 1 never overlaps the e2e tier: on a two-core machine some e2e tests failed beside a
# busy integration worker that pass alone. PYTEST_WORKERS=0 or E2E_WORKERS=0 runs that phase
# in one process. Benchmarks run at smoke size here (fewer timed repetitions, same
# assertions); `make bench` runs them at full size.
CORES          := $(shell nproc 2>/dev/null || echo 2)
PYTEST_WORKERS ?= $(shell n=$$((2 * $(CORES))); [ $$n -gt 16 ] && n=16; echo $$n)
E2E_WORKERS    ?= $(shell n=$(CORES); [ $$n -gt 4 ] && n=4; echo $$n)
SERIAL_TIERS   := e2e or benchmark
# Bytecode: the suite starts hundreds of Python processes (CLI runs, servers, node agents, fleet
# daemons) and three pytest processes that each collect every test module. With
# PYTHONDONTWRITEBYTECODE set (some shells and CI images set it), each of them compiled Grid's
# sources again: about 0.6 s of CPU per process and 10 s per collection. `make test` compiles
# the trees once up front (compileall, on every core) and lets its own processes keep bytecode
# in the git-ignored __pycache__ directories.
PYC_TREES      := grid_core grid_server grid_node plugins examples tests
test: export PYTHONDONTWRITEBYTECODE :=
test: engine browser etcd native
	@$(BIN)/python -m compileall -q -j 0 $(PYC_TREES)
	@status=0; \
	echo "make test: unit and integration tests on $(PYTEST_WORKERS) worker(s)"; \
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m "not ($(SERIAL_TIERS))" || status=$$?; \
	echo "make test: e2e tests on $(E2E_WORKERS) worker(s), one module per worker"; \
	$(BIN)/python -m pytest -q -n $(E2E_WORKERS) --dist loadfile -m e2e || { s=$$?; [ $$status -ne 0 ] || status=$$s; }; \
	echo "make test: benchmarks, one at a time"; \
	$(BIN)/python -m pytest -q -m benchmark || { s=$$?; [ $$status -ne 0 ] || status=$$s; }; \
	exit $$status

# The benchmark tier at full size (GRID_BENCH_FULL=1: every timed repetition), niced and with
# its printed numbers shown; never asserts wall-clock time.
bench: engine native
	GRID_BENCH_FULL=1 nice -n 10 $(BIN)/python -m pytest -q -s -m benchmark

check: native
	$(BIN)/python -m pytest -q tests/unit

# The controller's stateful property test as a soak: SOAK_STEPS steps (default 10,000) of
# random fleets and perturbations, progress and a report of steps, perturbations and
# violations; niced, since it runs for many minutes on a shared machine. `make test` runs a
# short derandomized version of the same test.
SOAK_STEPS ?= 10000
soak: native
	GRID_SOAK_STEPS=$(SOAK_STEPS) nice -n 10 $(BIN)/python -m pytest -q -s \
	  tests/unit/controller/test_controller_soak.py

# Static checks, all configured in pyproject.toml: style and format (ruff), types (mypy:
# strict on grid_core, default mode on the server, node and plugins), layers (import-linter).
# A `# type: ignore[code]` must also say why, in a trailing comment (mypy already refuses one
# without an error code, and one that no longer silences anything).
TYPED_TREES := grid_core grid_server grid_node plugins examples
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo
	@if grep -rnE --include='*.py' '# type: ignore(\[[^]]*\])? *$$' $(TYPED_TREES); then \
	  echo "lint: give each '# type: ignore[code]' above its reason in a trailing comment"; \
	  exit 1; fi

clean:
	rm -rf $(VENV) build *.egg-info
