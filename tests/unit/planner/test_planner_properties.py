"""Property tests: invariants 1, 2, 10 and determinism over heterogeneous fleets.

The checks below recompute every rule from the inputs alone (never from planner internals),
so a planner bug cannot hide behind its own bookkeeping. Fleets come from the Hypothesis
strategies in ``tests/support/fleet_strategies.py``: a failure shrinks to a minimal fleet,
which the test prints compactly (see docs/testing.md for a real shrunk example).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
from fleet_strategies import describe_plan_inputs, plan_inputs
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from planner_helpers import PLUGINS

from grid_core.headroom import admission_headroom_mb
from grid_core.planner import PlanInputs, PlannerPolicy, plan
from grid_core.planner.eligibility import MEMORY_STATES, host_ineligible_reason
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

EXAMPLES = 500
"""At least 500 fleets per property in the normal run (small fleets keep it fast)."""


SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def _fraction(h: HostSnapshot, policy: PlannerPolicy) -> float:
    f = min(1.0, h.throttle_fraction)
    return min(f, policy.throttled_fraction) if h.state == "throttled" else f


def _conflict(mid: str, peers: set[str], by_id: dict[str, ModelProfile]) -> bool:
    others = peers - {mid}
    p = by_id[mid]
    if set(p.colocation_excludes) & others:
        return True
    if any(mid in by_id[o].colocation_excludes for o in others if o in by_id):
        return True
    size = len(others) + 1
    if p.max_colocated_models and size > p.max_colocated_models:
        return True
    return any(
        o in by_id and by_id[o].max_colocated_models and size > by_id[o].max_colocated_models
        for o in others
    )


@contextmanager
def fleet_noted(inputs: PlanInputs) -> Iterator[None]:
    """On failure, print the (shrunk) fleet compactly beside Hypothesis's full repr."""
    try:
        yield
    except Exception:
        note("fleet:\n" + describe_plan_inputs(inputs))
        raise


@SETTINGS
@given(plan_inputs())
def test_plan_never_breaks_a_hard_rule(inputs: PlanInputs):
    with fleet_noted(inputs):
        _check_hard_rules(inputs)


def _check_hard_rules(inputs: PlanInputs) -> None:
    result = plan(inputs, PLUGINS.planner_hooks(), reuse=False)
    by_id = {p.model_id: p for p in inputs.profiles}
    hosts = {h.host_id: h for h in inputs.hosts}
    per_host: dict[str, list] = {}
    for a in result.assignments:
        per_host.setdefault(a.host_id, []).append(a)
    counts: dict[str, int] = {}
    for a in result.assignments:
        counts[a.model_id] = counts.get(a.model_id, 0) + 1
        prof, h = by_id[a.model_id], hosts[a.host_id]
        # invariant 2: eligible host, static compatibility (pins do not restrict: a floor)
        assert host_ineligible_reason(h, inputs.policy) is None
        assert any(rt in h.runtimes for rt in prof.runtimes)
        assert not prof.backends or set(prof.backends) & set(h.backends)
        assert set(prof.required_tags) <= set(h.tags)
        assert not set(prof.forbidden_tags) & set(h.tags)
    for hid, assigned in per_host.items():
        h = hosts[hid]
        ids = [a.model_id for a in assigned]
        assert len(ids) == len(set(ids)), "two replicas of one model on one host"
        live = [r for r in h.residencies if r.state in MEMORY_STATES]
        live_ids = {r.model_id for r in live}
        unmanaged = [r for r in live if r.ownership != "managed"]
        managed_assigned = [
            a
            for a in assigned
            if not any(r.model_id == a.model_id and r.ownership != "managed" for r in live)
        ]
        # invariant 1, desired ledger: unmanaged work first, then every managed replica
        desired_mb = (
            h.external_used_mb
            + sum(r.memory_mb for r in unmanaged)
            + sum(by_id[a.model_id].memory_for(h.runtimes) for a in managed_assigned)
        )
        if managed_assigned:
            assert desired_mb <= h.allocatable_mb, (hid, desired_mb, h.allocatable_mb)
        # invariant 1, incremental ledger: live now plus new allocations plus headroom
        new = [a for a in assigned if not a.incumbent]
        assert all(a.model_id not in live_ids for a in new)
        if new:
            live_mb = h.external_used_mb + sum(r.memory_mb for r in live)
            new_mb = sum(by_id[a.model_id].memory_for(h.runtimes) for a in new)
            limit = int(h.allocatable_mb * _fraction(h, inputs.policy))
            # every new replica leaves its own (size-proportional) headroom
            headroom = max(
                admission_headroom_mb(
                    by_id[a.model_id].memory_for(h.runtimes),
                    floor_mb=inputs.policy.admission_headroom_mb,
                    fraction=inputs.policy.admission_headroom_fraction,
                    override_mb=by_id[a.model_id].admission_headroom_mb,
                )
                for a in new
            )
            assert live_mb + new_mb + headroom <= limit
        # disk: uncached artifacts reserve their ceiling cumulatively against free disk
        if new and h.artifact_disk_free_mb is not None:
            disk = sum(
                by_id[a.model_id].artifact_size_mb or 0 for a in new if a.model_id not in h.cached
            )
            assert disk <= h.artifact_disk_free_mb
        # model slots and colocation (reciprocal)
        desired_set = set(ids) | {r.model_id for r in unmanaged}
        present = desired_set | live_ids if new else desired_set
        if h.max_models:
            assert len(present) <= h.max_models
        for a in managed_assigned:
            peers = present if not a.incumbent else desired_set
            assert not _conflict(a.model_id, peers, by_id), (hid, a.model_id, peers)
    # replica bounds and honest shortfalls (invariant 10)
    for mid, prof in by_id.items():
        n = counts.get(mid, 0)
        assert n <= prof.max_replicas and n <= result.desired[mid]
        missing = sum(
            u.missing
            for u in result.unmet
            if u.model_id == mid and u.code != "failure_domain_shortfall"
        )
        assert missing == result.desired[mid] - n, (mid, result.unmet)
        # a pin is a floor: each pin holds a replica, or the plan says why not
        where = {a.host_id for a in result.assignments if a.model_id == mid}
        assert n >= len(prof.pins) or any(u.model_id == mid for u in result.unmet)
        for pin in prof.pins:
            assert pin in where or any(
                u.model_id == mid
                and u.code in ("pin_unavailable", "preemption_staged", "relocation_staged")
                for u in result.unmet
            ), (mid, pin, result.unmet)
    # staged preemption: bounded, never protected work, beneficiary not on that host
    assert len(result.evictions) <= inputs.policy.max_evictions
    for e in result.evictions:
        r = hosts[e.host_id].residency(e.model_id)
        assert r is not None and r.ownership == "managed"
        victim = by_id.get(e.model_id)
        if victim is not None:
            assert e.host_id not in victim.pins
            if r.state in ("loading", "warming", "ready") and r.loaded_at is not None:
                assert inputs.now - r.loaded_at >= victim.min_residency_s
        # a replica the plan drains is never also one it keeps (whatever the eviction is for)
        placed = {(a.model_id, a.host_id) for a in result.assignments}
        assert (e.model_id, e.host_id) not in placed, (e, "kept and drained")
        if e.beneficiary is not None:
            assert (e.beneficiary, e.host_id) not in placed


@SETTINGS
@given(plan_inputs(), st.integers(0, 2**32 - 1))
def test_plan_is_deterministic_and_order_independent(inputs: PlanInputs, seed: int):
    with fleet_noted(inputs):
        first = plan(inputs, PLUGINS.planner_hooks(), reuse=False)
        assert plan(inputs, PLUGINS.planner_hooks(), reuse=False) == first
        # Only the order is random here (the fleet itself shrinks through its strategy).
        rng = random.Random(seed)
        profs, fleet = list(inputs.profiles), list(inputs.hosts)
        rng.shuffle(profs)
        rng.shuffle(fleet)
        fleet = [
            msgspec.structs.replace(
                h, residencies=tuple(rng.sample(h.residencies, len(h.residencies)))
            )
            for h in fleet
        ]
        demand = dict(rng.sample(list(inputs.demand.items()), len(inputs.demand)))
        shuffled = PlanInputs(
            now=inputs.now,
            profiles=tuple(profs),
            hosts=tuple(fleet),
            demand=demand,
            policy=inputs.policy,
        )
        again = plan(shuffled, PLUGINS.planner_hooks(), reuse=False)
        assert again == first
        assert again.digest == first.digest
