"""Upper bounds on service: no strategy may ever beat them, and the oracle sits below them.

The capacity bound (every fleet size) and the oracle's exhaustive per-minute bound (small
fleets) are claimed to be *proven*: these tests run every strategy on the same arrivals and
check that none serves more, and that the exhaustive schedule search finds at least what the
bounded beam finds.
"""

from __future__ import annotations

import pytest

from grid_core.scenario import oracle as oracle_mod
from grid_core.scenario.config import STRATEGIES


@pytest.mark.parametrize(("seed", "machines", "models"), [(5, 2, 5), (11, 3, 6)])
def test_no_strategy_serves_more_than_either_bound(run, seed, machines, models) -> None:
    for strategy in STRATEGIES:
        report = run(
            seed=seed,
            machines=machines,
            models=models,
            users=40,
            duration_s=14 * 60.0,
            strategy=strategy,
            oracle=True,
        )
        served = report["demand"]["served"]
        o, cap = report["oracle"], report["upper_bound"]
        assert served <= o["upper_bound_served"] <= cap["served"] <= cap["requests"], strategy
        assert o["ceiling_served"] <= o["upper_bound_served"]
        assert o["upper_bound_gap"] == o["upper_bound_served"] - served
        assert cap["requests"] == report["demand"]["requests"]


def test_the_capacity_bound_binds_on_an_overloaded_fleet(run) -> None:
    """Many users on one machine: the bound is capacity-limited, well below the requests."""
    report = run(seed=3, machines=1, models=4, users=400, duration_s=10 * 60.0)
    cap = report["upper_bound"]
    assert report["demand"]["served"] <= cap["served"] < cap["requests"]


def test_the_exhaustive_schedule_is_never_worse_than_the_beam(run, monkeypatch) -> None:
    kw = {"seed": 42, "machines": 2, "models": 6, "users": 60, "duration_s": 16 * 60.0}
    exact = run(oracle=True, **kw)["oracle"]
    assert exact["exact"] is True
    monkeypatch.setattr(oracle_mod, "EXACT_MAX_PLACEMENTS", 0)
    monkeypatch.setattr(oracle_mod, "TIE_STATES", 2)
    monkeypatch.setattr(oracle_mod, "BEAM", 2)
    beam = run(oracle=True, **kw)["oracle"]
    assert beam["exact"] is False
    assert beam["ceiling_served"] <= exact["ceiling_served"] <= exact["upper_bound_served"]
    assert beam["upper_bound_served"] == exact["upper_bound_served"]
