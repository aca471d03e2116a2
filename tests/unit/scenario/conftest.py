"""Fixtures for the scenario lab: exactly the plugins a run needs and real file stores."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from grid_lab.env import scratch_dir

from grid_core.scenario.config import ScenarioConfig
from grid_core.scenario.run import LabEnv, run_scenario
from grid_core.testing import plugins_with
from grid_server.store import FileStateStore

FULL = ("grid_forecast_ewma", "grid_scoring", "grid_victims", "grid_classifier")
REACTIVE = ("grid_scoring", "grid_victims", "grid_classifier")


@pytest.fixture(scope="module")
def plugin_sets():
    """(full, reactive) plugin facades built from the named built-ins only."""
    return plugins_with(builtins=FULL), plugins_with(builtins=REACTIVE)


@pytest.fixture
def lab(plugin_sets) -> Iterator[LabEnv]:
    """A lab environment whose controller stores are real files in a private scratch
    directory (memory-backed when available), removed after the test even on failure."""
    counter = iter(range(1, 1 << 20))
    with tempfile.TemporaryDirectory(prefix="grid-scenario-test-", dir=scratch_dir()) as tmp:

        def factory() -> FileStateStore:
            path = Path(tmp) / f"ctl-{next(counter)}" / "controller.json"
            path.parent.mkdir(mode=0o700)
            return FileStateStore(path)

        full, reactive = plugin_sets
        yield LabEnv(full, reactive, factory)


@pytest.fixture
def run(lab: LabEnv) -> Callable[..., dict]:
    """Run a scenario with small defaults (4 machines, 6 models, 40 users, 20 minutes)."""

    def _run(**kw) -> dict:
        base = {"machines": 4, "models": 6, "users": 40, "duration_s": 20 * 60.0, "seed": 7}
        base.update(kw)
        return run_scenario(ScenarioConfig(**base), lab)

    return _run
