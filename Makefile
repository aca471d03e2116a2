# Two set-up commands on a fresh machine with only python3:
#   make demo   — create .venv if missing, install, run the main job
#   make test   — create/update .venv, run the whole suite (unit, integration, e2e)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.grid-installed

.PHONY: demo test check lint engine venv clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# Build llama-server once (cached in the user cache, keyed by version); later runs reuse it.
engine: venv
	$(BIN)/grid engine install llama.cpp

demo: engine
	$(BIN)/python -m grid_server.smoke

test: engine
	$(BIN)/python -m pytest -q

check: venv
	$(BIN)/python -m pytest -q tests/unit

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info
