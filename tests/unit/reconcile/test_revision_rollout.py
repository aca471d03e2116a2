"""Revision rollout: the artifact SHA-256 is part of a replica's identity everywhere.

Changing a profile's ``artifact_sha256`` must warm the new revision (on another host while
the old one still holds its slot) before the old replica drains, keep at least one ready
replica of a required model the whole way, and end with only the new digest. Real controller
and planner over the simulated fleet; the reconciler and planner rules are also checked one
by one.
"""

from __future__ import annotations

import msgspec
from reconcile_helpers import deferred, host, kinds, plan, profile, ready, run
from simfleet import SimFleet, SimResidency

from grid_core.planner import plan as real_plan
from grid_core.planner.types import PlanInputs
from grid_core.profile import ModelProfile, revision_matches
from grid_core.testing import plugins_with

OLD, NEW, OTHER = "a" * 64, "b" * 64, "c" * 64


def _ready_digests(fleet: SimFleet, model_id: str) -> list[str | None]:
    return sorted(
        (r.sha or "")
        for n in fleet.nodes.values()
        for r in n.residencies.values()
        if r.model_id == model_id and r.state == "ready"
    )


def test_revision_rollout_warms_the_new_digest_before_the_old_drains() -> None:
    fleet = SimFleet.uniform(3, 16_000)
    prof = ModelProfile(
        model_id="m", memory_mb=4000, min_replicas=1, artifact_sha256=OLD, min_residency_s=0.0
    )
    fleet.put_profile(prof)
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.converge(rounds=8)
    assert _ready_digests(fleet, "m") == [OLD]

    fleet.put_profile(msgspec.structs.replace(prof, artifact_sha256=NEW))
    served_throughout = True
    for _ in range(30):
        fleet.now += 10.0
        for h in sorted(fleet.nodes):
            fleet.heartbeat(h)
        for h in sorted(fleet.nodes):
            while fleet.nodes[h].started:
                fleet.complete(h)
        served_throughout &= bool(_ready_digests(fleet, "m"))
    assert served_throughout  # a ready replica of the required model existed at every step
    assert fleet.violations == []
    assert _ready_digests(fleet, "m") == [NEW]
    # Nothing of the old revision is left holding memory anywhere.
    assert all(
        r.sha == NEW
        for n in fleet.nodes.values()
        for r in n.residencies.values()
        if r.model_id == "m"
    )


def test_a_single_host_refuses_the_unsafe_in_place_replacement() -> None:
    fleet = SimFleet.uniform(1, 16_000)
    prof = ModelProfile(
        model_id="m", memory_mb=4000, min_replicas=1, artifact_sha256=OLD, min_residency_s=0.0
    )
    fleet.put_profile(prof)
    fleet.ctl.set_mode("automatic", fleet.now)
    fleet.converge(rounds=8)
    fleet.put_profile(msgspec.structs.replace(prof, artifact_sha256=NEW))
    fleet.converge(rounds=10)
    # No peer can preserve availability: the old revision keeps serving, and status says why.
    assert _ready_digests(fleet, "m") == [OLD] and fleet.violations == []
    status = msgspec.to_builtins(fleet.ctl.status(fleet.now, detail=True))
    text = msgspec.json.encode(status).decode()
    assert "replacement_old_revision" in text or "replacement_missing" in text


def test_an_unknown_or_other_digest_satisfies_nothing() -> None:
    prof = profile("m", artifact_sha256=NEW)
    assert revision_matches(prof, NEW)
    assert not revision_matches(prof, None) and not revision_matches(prof, OLD)
    assert revision_matches(profile("m"), None)  # no declared digest: any weights serve

    # Placement: an old-revision replica is not an incumbent, the new one goes elsewhere,
    # and a cache of unknown digest does not count as cached.
    hosts = [
        host("h1", 16_000, ready("m", artifact_sha256=OLD)),
        host("h2", 16_000, cached={"m": None}),
        host("h3", 16_000, cached={"m": NEW}),
    ]
    inputs = PlanInputs(
        now=0.0, hosts=tuple(hosts), profiles=(profile("m", min_replicas=1, artifact_sha256=NEW),)
    )
    p = real_plan(inputs, plugins_with(builtins=("grid_scoring", "grid_victims")).planner_hooks())
    assert [(a.model_id, a.host_id, a.incumbent) for a in p.assignments] == [("m", "h3", False)]

    # Reconciliation: the old replica does not prove the replacement; a ready replica of an
    # unknown digest does not either; the exact one does.
    prof1 = profile("m", min_replicas=1, artifact_sha256=NEW)
    r = run(
        plan({"m": ["h2"]}),
        [host("h1", 16_000, ready("m", artifact_sha256=OLD)), host("h2", 16_000, ready("m"))],
        [prof1],
    )
    assert deferred(r)[("drain", "h1", "m")] == "replacement_old_revision"
    r = run(
        plan({"m": ["h2"]}),
        [
            host("h1", 16_000, ready("m", artifact_sha256=OLD)),
            host("h2", 16_000, ready("m", artifact_sha256=NEW)),
        ],
        [prof1],
    )
    assert kinds(r) == [("drain", "h1", "m")]
    # A plan that (by a pin) asks for the old host gets no in-place warm: status says why.
    r = run(plan({"m": ["h1"]}), [host("h1", 16_000, ready("m", artifact_sha256=OLD))], [prof1])
    assert kinds(r) == [] and deferred(r)[("warm", "h1", "m")] == "old_revision_here"


def test_warm_commands_carry_the_revision_and_a_new_digest_is_a_new_action() -> None:
    fleet = SimFleet.uniform(2, 16_000)
    fleet.put_profile(
        ModelProfile(model_id="m", memory_mb=4000, min_replicas=1, artifact_sha256=OLD)
    )
    fleet.ctl.set_mode("automatic", fleet.now)
    cmds = fleet.heartbeat("h1") + fleet.heartbeat("h2")
    warm = [c for c in cmds if c.kind in ("load", "warm")]
    assert warm and all(c.artifact_sha256 == OLD for c in warm)
    ids_old = {c.action_id for c in warm}
    fleet.put_profile(
        ModelProfile(model_id="m", memory_mb=4000, min_replicas=1, artifact_sha256=OTHER)
    )
    fleet.now += 1.0
    cmds = fleet.heartbeat("h1") + fleet.heartbeat("h2")
    new = [c for c in cmds if c.kind in ("load", "warm") and c.artifact_sha256 == OTHER]
    assert all(c.action_id not in ids_old for c in new)


def test_cooldown_does_not_count_old_revision_replicas() -> None:
    fleet = SimFleet.uniform(2, 16_000)
    fleet.nodes["h1"].residencies["m"] = SimResidency(
        "m", 4000, "ready", loaded_at=fleet.now, sha=OLD
    )
    fleet.put_profile(
        ModelProfile(model_id="m", memory_mb=4000, max_replicas=2, artifact_sha256=NEW)
    )
    fleet.heartbeat("h1")
    fleet.heartbeat("h2")
    fc = fleet.ctl.last.forecasts["m"]
    # The old replica is not ready capacity of this revision and holds no cooldown slot.
    assert fc.desired_replicas <= 1
