"""Host protection driven by recorded telemetry sequences (5-second samples)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from grid_core.protection import (
    DEBOUNCE_SAMPLES,
    DRAIN_GRACE_S,
    RECOVERY_COOLDOWN_S,
    SEVERITY,
    Override,
    ProtectionPolicy,
    ProtectionState,
    Sample,
    step,
)

PERIOD = 5.0
LAPTOP = ProtectionPolicy()
WALL = 1_800_000_000.0
CALM = {
    "cpu_pct": 10.0,
    "memory_pct": 40.0,
    "temperature_c": 50.0,
    "network_up": True,
    "battery_pct": 100.0,
    "charging": True,
    "user_idle_s": 600.0,
}


def run(rows, policy=LAPTOP, override=None, active=None):
    """Feed rows of sensor overrides (merged over CALM); return the effective state per sample."""
    state = ProtectionState()
    out = []
    for i, row in enumerate(rows):
        sample = Sample(at=i * PERIOD, **{**CALM, **row})
        busy = active[i] if active is not None else 0
        state, decision = step(
            state,
            sample,
            policy,
            override=override,
            wall_now=WALL + i * PERIOD,
            active_requests=busy,
        )
        out.append(decision)
    return out


def states(decisions):
    return [d.state for d in decisions]


def test_battery_falling_while_unplugged_throttles_then_pauses():
    levels = [80, 70, 60, 48, 46, 44, 40, 30, 19, 18, 17, 16]
    rows = [{"battery_pct": b, "charging": False} for b in levels]
    got = run(rows)
    assert states(got)[:5] == ["accepting"] * 5
    assert got[5].state == "throttled" and "battery" in got[5].reason
    assert got[10].state == "paused"
    assert got[10].throttle_fraction == 0.0 and not got[10].admits_new_work


def test_battery_ignored_on_dedicated_server():
    rows = [{"battery_pct": 5, "charging": False}] * 10
    assert set(states(run(rows, ProtectionPolicy(dedicated=True)))) == {"accepting"}


def test_one_sample_spike_is_ignored():
    rows = [{}, {}, {"temperature_c": 99.0, "cpu_pct": 100.0}, {}, {}, {"memory_pct": 99.0}, {}]
    got = run(rows)
    assert set(states(got)) == {"accepting"}
    assert got[2].raw_state == "unhealthy"  # the spike is visible, but not acted on


def test_thermal_spike_sustained_becomes_unhealthy_and_cools_down_slowly():
    hot = [{"temperature_c": 97.0}] * 4
    cooling = [{"temperature_c": 80.0}] * 3  # below critical, above the recovery line
    cool = [{"temperature_c": 60.0}] * 20
    got = run(hot + cooling + cool)
    assert got[DEBOUNCE_SAMPLES - 1].state == "unhealthy"
    assert all(d.state == "unhealthy" for d in got[DEBOUNCE_SAMPLES - 1 : 7])
    first_ok = next(i for i, d in enumerate(got) if i > 7 and d.state == "accepting")
    # Recovery needed the full cooldown below the recovery threshold.
    assert (first_ok - 7) * PERIOD >= RECOVERY_COOLDOWN_S


def test_recovery_cooldown_restarts_when_the_sensor_relapses():
    high = [{"cpu_pct": 95.0}] * 3
    calm = [{"cpu_pct": 20.0}] * 6
    relapse = [{"cpu_pct": 80.0}]  # below entry (90) but above recovery (70)
    tail = [{"cpu_pct": 20.0}] * 14
    got = run(high + calm + relapse + tail)
    assert got[2].state == "throttled"
    # Without the relapse the cooldown would have finished at sample 2 + 12; it restarted.
    assert got[2 + int(RECOVERY_COOLDOWN_S / PERIOD)].state == "throttled"
    assert got[-1].state == "accepting"


def test_hysteresis_does_not_flap_around_the_entry_threshold():
    rows = [{"cpu_pct": v} for v in [95, 95, 95, 88, 92, 85, 91, 87, 93, 86] * 3]
    got = run(rows)
    assert states(got)[2:] == ["throttled"] * (len(rows) - 2)


def test_override_is_stricter_only():
    hot = [{"temperature_c": 99.0}] * 5
    drain = Override(kind="drain", reason="taking laptop home", set_at=WALL)
    got = run(hot, override=drain)
    assert got[0].state == "draining"
    assert got[-1].state == "unhealthy"  # danger outranks the milder override
    quarantine = Override(kind="quarantine", reason="thermal fault", set_at=WALL)
    assert set(states(run(hot, override=quarantine))) == {"quarantined"}


def test_override_expires_by_itself():
    o = Override(kind="pause", reason="battery use", set_at=WALL, expires_at=WALL + 3 * PERIOD)
    got = run([{}] * 6, override=o)
    assert states(got)[:3] == ["paused"] * 3
    assert states(got)[3:] == ["accepting"] * 3
    assert got[0].reason == "local pause: battery use"


def test_pause_lets_running_requests_finish_within_grace():
    o = Override(kind="pause", reason="meeting", set_at=WALL)
    active = [2, 1, 1, 0, 0]
    got = run([{}] * 5, override=o, active=active)
    assert states(got) == ["draining", "draining", "draining", "paused", "paused"]
    stuck = int(DRAIN_GRACE_S / PERIOD) + 2
    got = run([{}] * stuck, override=o, active=[1] * stuck)
    assert got[0].state == "draining" and got[-1].state == "paused"


def test_unknown_sensors_policy():
    bare = [{"temperature_c": None, "user_idle_s": None, "network_up": None}] * 4
    assert states(run(bare))[-1] == "accepting"
    strict = ProtectionPolicy(unknown="throttle")
    got = run(bare, strict)
    assert got[-1].state == "throttled" and "unknown sensors" in got[-1].reason


def test_network_loss_is_unhealthy():
    got = run([{"network_up": False}] * 3)
    assert got[-1].state == "unhealthy"


sample_rows = st.fixed_dictionaries(
    {
        "cpu_pct": st.one_of(st.none(), st.floats(0, 100)),
        "memory_pct": st.one_of(st.none(), st.floats(0, 100)),
        "temperature_c": st.one_of(st.none(), st.floats(20, 110)),
        "battery_pct": st.one_of(st.none(), st.floats(0, 100)),
        "charging": st.one_of(st.none(), st.booleans()),
        "network_up": st.one_of(st.none(), st.booleans()),
    }
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(sample_rows, min_size=1, max_size=30),
    st.sampled_from([None, "drain", "pause", "quarantine"]),
)
def test_override_never_relaxed_by_sensors(rows, kind):
    override = Override(kind=kind, reason="r", set_at=WALL) if kind else None
    plain = run(rows)
    with_override = run(rows, override=override)
    for a, b in zip(plain, with_override, strict=True):
        assert SEVERITY[b.state] >= SEVERITY[a.state]
        if kind == "quarantine":
            assert b.state == "quarantined"
