"""``grid test compete``'s reading of allocator status documents and its refusal without a
fleet (no server: status documents shaped as the server writes them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from grid_fleet import compete
from typer.testing import CliRunner

from grid_core.cli import build_app
from grid_core.testing import plugins_with

STATUS = {
    "controller": {
        "hosts": [
            {
                "host_id": "host-01",
                "residencies": [
                    {"model_id": "base", "state": "ready"},
                    {"model_id": "fast", "state": "cached"},
                ],
            },
            {"host_id": "host-02", "residencies": [{"model_id": "fast", "state": "ready"}]},
            {"host_id": "host-03", "residencies": [{"model_id": "slow", "state": "draining"}]},
        ],
        "plan": {"assignments": [{"model_id": "fast", "host_id": "host-02"}]},
        "portfolio": {
            "mapping": {"coding": "fast"},
            "candidates": [
                {"workload": "research", "model_id": "fast", "utility": 1.0},
                {"workload": "coding", "model_id": "fast", "utility": 40.0},
                {"workload": "coding", "model_id": "slow", "rejection": "no live host"},
            ],
            "admissions": [{"workload": "coding", "state": "ready", "model_id": "fast"}],
        },
        "history": [
            {"model_id": "slow", "kind": "warm", "status": "failed", "created_at": 100.0,
             "host_id": "host-03", "message": "engine exited"},
        ],
    }
}  # fmt: skip


def test_residencies_plan_and_portfolio_rows_are_read_per_model():
    assert compete.states(STATUS, "fast") == {"host-02": "ready"}  # cached weights are not
    assert compete.ready_hosts(STATUS, "fast") == ["host-02"]
    assert compete.ready_hosts(STATUS, "slow") == []  # draining is not ready
    assert compete.planned_hosts(STATUS, "fast") == ["host-02"]
    assert compete.candidate_row(STATUS, "fast")["utility"] == 40.0  # the coding row
    assert compete.candidate_row(STATUS, "slow")["rejection"] == "no live host"
    assert compete.candidate_row(STATUS, "base") is None
    assert compete.admission_row(STATUS)["state"] == "ready"
    assert compete.admission_row({}) is None


def test_only_a_start_failure_after_the_request_counts():
    assert compete.start_failure(STATUS, "slow", since=50.0) == (
        "warm on host-03 failed: engine exited"
    )
    assert compete.start_failure(STATUS, "slow", since=150.0) is None  # an older failure
    assert compete.start_failure(STATUS, "fast", since=0.0) is None


def test_an_answer_ahead_of_the_residency_report_waits_for_it():
    """The router answers from a freshly warmed engine up to a heartbeat before the host
    reports it ready (seen on a 3-host fleet: the serve step failed with "answered from []"
    although the winner answered from the planned host)."""
    warming = {"controller": {"hosts": [{"host_id": "host-02", "residencies": [
        {"model_id": "fast", "state": "warming"}]}]}}  # fmt: skip
    assert compete.served_hosts(warming, "fast", ["host-02"]) is None  # read status again
    assert compete.served_hosts(STATUS, "fast", ["host-02"]) == ["host-02"]
    with pytest.raises(compete.cs.CompeteError, match="plan placed it on"):
        compete.served_hosts(STATUS, "fast", ["host-03"])


def test_the_choice_names_standby_before_the_workload_is_admitted():
    """Seen on a 3-host fleet: the standby leader answered and the step said "mapped coding
    to None"."""
    assert compete.choice(STATUS) == "mapped coding to fast"
    before = {"controller": {"portfolio": {"mapping": {}, "standby": {"coding": "fast"}}}}
    assert compete.choice(before) == ("stands fast by for coding (idle capacity, before admission)")


def test_only_an_answer_the_allocator_chose_fails_the_serve_step():
    """Seen on a 3-host fleet: both candidates became ready in the same second before the
    coding workload was admitted, and the router's configured favourite answered first; the
    step failed with "portfolio mapping {}" although the allocator had chosen nothing."""
    cands = ["fast", "slow"]
    unchosen = {"controller": {"portfolio": {"mapping": {}, "standby": {}}}}
    assert compete.another_choice(unchosen, "slow", "fast", cands) is None  # keep asking
    standby = {"controller": {"portfolio": {"mapping": {}, "standby": {"coding": "fast"}}}}
    assert compete.another_choice(standby, "slow", "fast", cands) is None  # fast still starting
    assert compete.another_choice(STATUS, "fast", "fast", cands) is None
    chose_slow = {"controller": {"portfolio": {"mapping": {"coding": "slow"}}}}
    wrong = compete.another_choice(chose_slow, "slow", "fast", cands)
    assert wrong is not None and "served coding with slow" in wrong
    assert "mapped coding to slow" in wrong
    by_standby = {"controller": {"portfolio": {"mapping": {}, "standby": {"coding": "slow"}}}}
    assert "stands slow by" in (compete.another_choice(by_standby, "slow", "fast", cands) or "")


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"id": "c1", "choices": [{"message": {"content": ""}}], "usage": {"completion_tokens": 1}},
         None),
        ({"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": 1}},
         "no response id"),
        ({"id": "c1", "choices": [], "usage": {"completion_tokens": 1}}, "no choices"),
        ({"id": "c1", "choices": [{"message": {"content": "x"}}]}, "no usage.completion_tokens"),
    ],
)  # fmt: skip
def test_a_real_answer_has_an_id_a_choice_and_generated_tokens(doc, problem):
    """Empty text is allowed: a random-weight model may end its turn at once."""
    assert compete.not_real(doc) == problem


def test_without_a_running_fleet_the_command_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GRID_HOME", str(tmp_path))
    app = build_app(plugins_with(builtins=("grid_fleet",)))
    result = CliRunner().invoke(app, ["test", "compete", "--json"])
    assert result.exit_code != 0
    assert "no logical fleet is running here" in str(result.exception) + result.output
    said = str(result.exception) + result.output
    assert "grid test start" in said and "--workload-score coding=" in said  # what compete needs
