"""``grid test compete``'s temporary profile edits against the real server (in process):
journalled before they are sent, undone exactly (same version), undone by the next run after
an interruption, and never written over an operator's change made meanwhile."""

from __future__ import annotations

from pathlib import Path

import pytest
from grid_fleet import compete_score as cs
from grid_fleet.compete import ProfileEdits
from server_testbed import Grid

pytestmark = pytest.mark.integration

PROFILE = {
    "memory_mb": 100,
    "required_tags": ["cpu"],
    "workload_scores": {"coding": 0.8},
    "scale_down_cooldown_s": 15.0,
}


def _read(grid: Grid, model: str) -> dict:
    return grid.http.get(f"{grid.url}/allocator/models/{model}").json()


def test_edits_are_journalled_and_restored_to_the_same_version(grid: Grid, tmp_path: Path):
    grid.http.put(
        f"{grid.url}/allocator/models/m", json=PROFILE, headers=grid.operator()
    ).raise_for_status()
    before = _read(grid, "m")
    journal = tmp_path / "compete-edits.json"
    lines: list[str] = []
    edits = ProfileEdits(grid.client, journal, lines.append)

    edits.apply("m", cs.with_min_replica)
    assert journal.exists() and _read(grid, "m")["profile"]["min_replicas"] == 1
    edits.apply("m", cs.with_constraint)  # computed from the original: min_replicas back to 0
    edited = _read(grid, "m")["profile"]
    assert edited.get("min_replicas", 0) == 0
    assert edited["required_tags"] == ["cpu", cs.CONSTRAINT_TAG]

    # The run is interrupted here; the next run's recovery undoes the edit exactly.
    ProfileEdits(grid.client, journal, lines.append).recover()
    assert _read(grid, "m") == before
    assert not journal.exists()
    assert any("interrupted run" in line for line in lines)


def test_an_operator_change_made_meanwhile_is_never_overwritten(grid: Grid, tmp_path: Path):
    grid.http.put(
        f"{grid.url}/allocator/models/m", json=PROFILE, headers=grid.operator()
    ).raise_for_status()
    edits = ProfileEdits(grid.client, tmp_path / "compete-edits.json", lambda _s: None)
    edits.apply("m", cs.with_constraint)
    # Someone raises the priority while the command runs.
    current = _read(grid, "m")
    grid.http.put(
        f"{grid.url}/allocator/models/m",
        json={**current["profile"], "priority": 7},
        headers={**grid.operator(), "If-Match": f'"{current["version"]}"'},
    ).raise_for_status()

    problems = edits.restore_all()
    assert len(problems) == 1 and "changed by someone else" in problems[0]
    assert _read(grid, "m")["profile"]["priority"] == 7  # their change stands
    assert not (tmp_path / "compete-edits.json").exists()
