"""Projects with stable work stages and the prefetch scorecard."""

from __future__ import annotations

import itertools

from grid_core.profile import ModelProfile
from grid_core.scenario.arrivals import DemandCurves, build_arrivals
from grid_core.scenario.fleet import Order
from grid_core.scenario.personas import STAGE_MINUTES, TEAMS, build_users, stage_now
from grid_core.scenario.scorecard import PrefetchScorecard
from grid_core.scenario.serving import session_hash


def test_a_staged_project_cycles_through_its_stages_in_order() -> None:
    for team, stages in TEAMS.items():
        cycle = STAGE_MINUTES * len(stages)
        for project in range(4):
            runs: list[list[str]] = []
            for minute in range(3 * cycle):
                [now] = [s for s in stages if stage_now(s, project, minute)]
                if runs and runs[-1][0] == now:
                    runs[-1].append(now)
                else:
                    runs.append([now])
            for a, b in itertools.pairwise(runs):
                assert stages.index(b[0]) == (stages.index(a[0]) + 1) % len(stages), team
            assert all(len(r) == STAGE_MINUTES for r in runs[1:-1])


def test_stages_move_who_asks_not_how_many() -> None:
    users = build_users(5, 100)
    trace = build_arrivals(5, users, 60, DemandCurves())
    staged = {u.index for u in users if u.persona.name in TEAMS["creative"]}
    in_stage = total = 0
    for minute, batch in enumerate(trace):
        for a in batch:
            if a.user in staged:
                total += 1
                in_stage += stage_now(a.persona, a.project, minute)
    assert total > 0 and in_stage / total > 0.9
    # A project's members share one session key whatever their persona.
    assert session_hash("design", 0) == session_hash("video", 0) != session_hash("design", 1)


def test_the_scorecard_counts_hits_unused_and_avoided_load() -> None:
    p = ModelProfile(model_id="v", memory_mb=1000, load_estimate_s=30.0, warm_estimate_s=10.0)
    card = PrefetchScorecard({"v": p})
    start = [Order("1", "load", "h1", "v"), Order("2", "warm", "h1", "v")]
    card.record(0, start, frozenset({"v"}), set(), {("h1", "v")})
    card.record(1, [], frozenset({"v"}), set(), {("h1", "v")})
    card.record(2, [], frozenset(), {"v"}, {("h1", "v")})  # first use two minutes later
    card.record(3, [Order("3", "warm", "h2", "v")], frozenset({"v"}), {"v"}, {("h1", "v")})
    # h2's start was ordered but the replica never came up: unused.
    out = card.report()
    assert out["prefetch_downloads"] == 1 and out["predictive_starts"] == 2
    assert out["hits"] == 1 and out["unused_predictions"] == 1
    assert out["median_lead_s"] == 120.0 and out["avoided_load_s"] == 40.0
