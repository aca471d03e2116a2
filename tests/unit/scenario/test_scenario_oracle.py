"""The hindsight oracle bounds what a strategy achieved on the same run."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("seed", "machines", "models"), [(7, 3, 6), (42, 4, 8), (144, 2, 5)])
def test_the_ceiling_is_never_below_smart_served_demand(run, seed, machines, models) -> None:
    report = run(
        seed=seed, machines=machines, models=models, users=40, duration_s=16 * 60.0, oracle=True
    )
    oracle = report["oracle"]
    served = report["demand"]["served"]
    assert oracle["strategy_served"] == served
    assert oracle["ceiling_served"] >= served
    assert oracle["gap"] == oracle["ceiling_served"] - served
    assert oracle["ceiling_served"] <= oracle["requests"] == report["demand"]["requests"]
    assert oracle["states_evaluated"] > 0
    assert oracle["disk_audit"]["violations"] == 0


def test_the_oracle_schedule_respects_the_hold(run) -> None:
    oracle = run(seed=3, machines=2, models=5, duration_s=12 * 60.0, oracle=True)["oracle"]
    minutes = [c["minute"] for c in oracle["changes"]]
    assert all(m % oracle["hold_minutes"] == 0 for m in minutes)
    placed = [c for c in oracle["changes"] if c["cause"] == "placement"]
    assert oracle["mutations"] >= len(placed) > 0
