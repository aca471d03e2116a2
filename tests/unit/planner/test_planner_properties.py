"""Property tests: invariants 1, 2, 10 and determinism over random heterogeneous fleets.

The checks below recompute every rule from the inputs alone (never from planner internals),
so a planner bug cannot hide behind its own bookkeeping.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_helpers import GB, NOW, PLUGINS

from grid_core.demand.types import ModelDemand
from grid_core.planner import PlanInputs, PlannerPolicy, plan
from grid_core.planner.eligibility import MEMORY_STATES, host_ineligible_reason
from grid_core.profile import ModelProfile, validate_profile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot

EXAMPLES = 500
"""At least 500 random fleets per property in the normal run (small fleets keep it fast)."""

MODEL_IDS = ("m0", "m1", "m2", "m3", "m4", "m5")
HOST_IDS = tuple(f"h{i}" for i in range(7))
TAGS = ("ecc", "office", "fast-disk")
STATES = (
    "accepting",
    "accepting",
    "accepting",
    "throttled",
    "draining",
    "paused",
    "unhealthy",
    "quarantined",
)
AGES = (1.0, 1.0, 5.0, 400.0, None, -60.0, -1.0)


def _profiles(rng: random.Random) -> list[ModelProfile]:
    ids = MODEL_IDS[: rng.randint(1, len(MODEL_IDS))]
    out = []
    for mid in ids:
        mx = rng.randint(1, 4)
        runtimes = rng.choice([("llama.cpp",), ("vllm",), ("llama.cpp", "vllm")])
        rt_mem = {}
        if "vllm" in runtimes and rng.random() < 0.5:
            rt_mem = {"vllm": rng.randint(1, 24) * GB}
        others = [m for m in ids if m != mid]
        out.append(
            validate_profile(
                ModelProfile(
                    model_id=mid,
                    memory_mb=rng.randint(1, 24) * GB,
                    runtime_memory_mb=rt_mem,
                    runtimes=runtimes,
                    backends=rng.choice([(), (), ("cuda",), ("metal",)]),
                    min_replicas=rng.randint(0, mx),
                    max_replicas=mx,
                    priority=rng.randint(0, 2),
                    required_tags=(rng.choice(TAGS),) if rng.random() < 0.2 else (),
                    forbidden_tags=(rng.choice(TAGS),) if rng.random() < 0.2 else (),
                    min_failure_domains=rng.randint(1, 3),
                    max_colocated_models=rng.choice([0, 0, 0, 1, 2]),
                    colocation_excludes=(rng.choice(others),)
                    if others and rng.random() < 0.3
                    else (),
                    pins=(rng.choice(HOST_IDS),) if rng.random() < 0.1 else (),
                    artifact_size_mb=rng.choice([None, 2 * GB, 8 * GB]),
                    min_residency_s=rng.choice([0.0, 300.0]),
                )
            )
        )
    return out


def _residency(rng: random.Random, mid: str) -> ResidencySnapshot:
    return ResidencySnapshot(
        model_id=mid,
        memory_mb=rng.randint(1, 16) * GB,
        state=rng.choice(["ready", "ready", "loading", "warming", "draining", "failed", "cached"]),
        ownership=rng.choice(["managed", "managed", "managed", "external", "manual", "pinned"]),
        active_requests=rng.choice([0, 0, 2, None]),
        loaded_at=NOW - rng.choice([10.0, 5000.0]),
    )


def _hosts(rng: random.Random, models: list[ModelProfile]) -> list[HostSnapshot]:
    out = []
    for hid in HOST_IDS[: rng.randint(1, len(HOST_IDS))]:
        mids = rng.sample([*MODEL_IDS, "ext-1"], rng.randint(0, 3))
        out.append(
            HostSnapshot(
                host_id=hid,
                capacity_mb=rng.randint(4, 64) * GB,
                reserved_mb=rng.randint(0, 4) * GB,
                thermal_derating=rng.choice([0.0, 0.0, 0.1]),
                state=rng.choice(STATES),
                healthy=rng.random() < 0.85,
                heartbeat_age_s=rng.choice(AGES),
                runtimes=rng.choice([("llama.cpp",), ("llama.cpp", "vllm"), ("vllm",)]),
                backends=rng.choice([("metal",), ("cuda",)]),
                tags=tuple(sorted(t for t in TAGS if rng.random() < 0.5)),
                failure_domain=rng.choice(["fd-1", "fd-2", "fd-3", None]),
                max_models=rng.choice([0, 0, 1, 2, 3]),
                throttle_fraction=rng.choice([1.0, 1.0, 0.5]),
                external_used_mb=rng.choice([0, 0, 2 * GB]),
                artifact_disk_free_mb=rng.choice([None, 4 * GB, 40 * GB]),
                residencies=tuple(_residency(rng, m) for m in mids),
                cached={m.model_id: None for m in models if rng.random() < 0.15},
            )
        )
    return out


def random_inputs(seed: int) -> PlanInputs:
    """One random heterogeneous fleet (seeded: generation must stay cheap next to 500 runs)."""
    rng = random.Random(seed)
    models = _profiles(rng)
    fleet = _hosts(rng, models)
    demand = {}
    for m in models:
        if rng.random() < 0.5:
            demand[m.model_id] = ModelDemand(
                model_id=m.model_id,
                desired_replicas=rng.randint(0, 6),
                queue_depth=rng.choice([0.0, 3.0]),
                request_rate_rps=rng.choice([0.0, 1.0, 2.0]),
                direct=rng.random() < 0.5,
            )
    policy = PlannerPolicy(admission_headroom_mb=rng.choice([0, 512]))
    return PlanInputs(
        now=NOW, profiles=tuple(models), hosts=tuple(fleet), demand=demand, policy=policy
    )


plan_inputs = st.integers(0, 2**63 - 1).map(random_inputs)


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


@SETTINGS
@given(plan_inputs)
def test_plan_never_breaks_a_hard_rule(inputs: PlanInputs):
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
            assert live_mb + new_mb + inputs.policy.admission_headroom_mb <= limit
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

        if e.beneficiary is not None:
            assert (e.beneficiary, e.host_id) not in {
                (a.model_id, a.host_id) for a in result.assignments
            }
            assert (e.model_id, e.host_id) not in {
                (a.model_id, a.host_id) for a in result.assignments
            }


@SETTINGS
@given(plan_inputs, st.integers(0, 2**32 - 1))
def test_plan_is_deterministic_and_order_independent(inputs: PlanInputs, seed: int):
    first = plan(inputs, PLUGINS.planner_hooks(), reuse=False)
    assert plan(inputs, PLUGINS.planner_hooks(), reuse=False) == first
    rng = random.Random(seed)
    profs, fleet = list(inputs.profiles), list(inputs.hosts)
    rng.shuffle(profs)
    rng.shuffle(fleet)
    fleet = [
        h.__class__(
            **{
                **{f: getattr(h, f) for f in h.__struct_fields__},
                "residencies": tuple(rng.sample(h.residencies, len(h.residencies))),
            }
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
