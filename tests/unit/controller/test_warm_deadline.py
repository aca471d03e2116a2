"""The load deadline comes from the profile and learned timings (issue 20).

Each warm command carries how long the node may wait for readiness: three times the expected
warm time (the learned one for that host and artifact revision, else the profile's
``warm_estimate_s``), at least the old fixed 180 s and at most an hour. Status shows the
deadline and what set it on every warm action.
"""

from __future__ import annotations

import pytest
from simfleet import SimFleet

from grid_core.profile import ModelProfile
from grid_core.reconcile.timings import (
    TIMING_AUTHORITY_SAMPLES,
    WARM_DEADLINE_FACTOR,
    WARM_DEADLINE_FLOOR_S,
    WARM_DEADLINE_MAX_S,
    warm_deadline_s,
)


def prof(warm_estimate_s: float, **kw: object) -> ModelProfile:
    return ModelProfile(
        model_id="m",
        memory_mb=4000,
        min_replicas=1,
        warm_estimate_s=warm_estimate_s,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("estimate", "learned", "want"),
    [
        (400.0, None, (1200.0, "profile")),  # the field case: 400 s estimate, 180 s cut it
        (10.0, None, (WARM_DEADLINE_FLOOR_S, "floor")),  # a quick model keeps the floor
        (400.0, 100.0, (300.0, "learned")),  # what the host really measured wins
        (10.0, 150.0, (450.0, "learned")),  # ... also when it is slower than the profile says
        (10.0, 5.0, (WARM_DEADLINE_FLOOR_S, "floor")),
        (3000.0, None, (WARM_DEADLINE_MAX_S, "profile")),  # never beyond an hour
    ],
)
def test_warm_deadline_is_three_expected_warm_times_within_floor_and_ceiling(
    estimate: float, learned: float | None, want: tuple[float, str]
) -> None:
    assert WARM_DEADLINE_FACTOR == 3.0 and WARM_DEADLINE_FLOOR_S == 180.0
    assert warm_deadline_s(prof(estimate), learned) == want


def _first_warm(fleet: SimFleet) -> object:
    fleet.ctl.set_mode("automatic", fleet.now)
    for _ in range(5):
        fleet.now += 10.0
        sent = fleet.heartbeat("h1")
        warms = [c for c in sent if c.kind == "warm"]
        if warms:
            return warms[0]
        while fleet.nodes["h1"].started:
            fleet.complete("h1")
    raise AssertionError("no warm was delivered")


def _status_warm(fleet: SimFleet) -> object:
    st = fleet.ctl.status(fleet.now, detail=True)
    views = [v for v in [*st.pending_commands, *st.history] if v.kind == "warm"]
    assert views, "status shows no warm action"
    return views[0]


def test_a_warm_command_carries_the_profiles_deadline_and_status_shows_it() -> None:
    fleet = SimFleet({"h1": 16_000})
    fleet.put_profile(prof(400.0))
    warm = _first_warm(fleet)
    assert warm.ready_timeout_s == 1200.0  # type: ignore[attr-defined]
    view = _status_warm(fleet)
    assert (view.ready_timeout_s, view.deadline_basis) == (1200.0, "profile")  # type: ignore[attr-defined]


def test_a_warm_command_carries_the_learned_deadline_once_the_host_has_measured_it() -> None:
    fleet = SimFleet({"h1": 16_000})
    fleet.put_profile(prof(10.0))
    for _ in range(TIMING_AUTHORITY_SAMPLES):
        assert fleet.ctl.timings.observe(
            host_id="h1",
            model_id="m",
            sha=None,
            kind="warm",
            artifact_fetched=False,
            duration_s=200.0,
            now=fleet.now,
        )
    warm = _first_warm(fleet)
    assert warm.ready_timeout_s == 600.0  # type: ignore[attr-defined]
    view = _status_warm(fleet)
    assert (view.ready_timeout_s, view.deadline_basis) == (600.0, "learned")  # type: ignore[attr-defined]


def test_a_quick_model_keeps_the_floor_and_loads_carry_no_deadline() -> None:
    fleet = SimFleet({"h1": 16_000})
    fleet.put_profile(prof(2.0))
    warm = _first_warm(fleet)
    assert warm.ready_timeout_s == WARM_DEADLINE_FLOOR_S  # type: ignore[attr-defined]
    st = fleet.ctl.status(fleet.now, detail=True)
    loads = [v for v in [*st.pending_commands, *st.history] if v.kind == "load"]
    assert all(v.ready_timeout_s is None for v in loads)
