"""Bound change (specification, "Safety invariants" 8): the details, one test each.

* among equally disruptive victim sets, the host where the beneficiary starts soonest;
* under a tight budget, the preemption group with the fewest transitions left;
* preemption drains carry the beneficiary's replica round;
* withdrawal takes a leaf first and never a delivered member of a lifecycle;
* a replica count that only the cooldown holds never opens a new slot;
* a delivered constructive action is never cancelled.
"""

from __future__ import annotations

from reconcile_helpers import NOW, deferred, host, plan, profile, ready, run

from grid_core.demand.types import ModelDemand
from grid_core.planner import plan as real_plan
from grid_core.planner.types import Eviction, PlanInputs, PlannerPolicy
from grid_core.reconcile import Action, ActionBook, GovernorPolicy
from grid_core.reconcile.governor import admit
from grid_core.reconcile.reconciler import Proposal
from grid_core.snapshot import ModelPerformance
from grid_core.testing import plugins_with

SHA = "e" * 64
HOOKS = plugins_with(builtins=("grid_scoring", "grid_victims")).planner_hooks()
POLICY = PlannerPolicy(admission_headroom_mb=0, admission_headroom_fraction=0.0)


def _full_hosts(**extra: dict[str, object]) -> list:  # type: ignore[type-arg]
    """h1 holds low-priority v1, h2 holds v2: identical victims, room for one model each."""
    old = NOW - 3600.0
    return [
        host("h1", 8000, ready("v1", 6000, loaded_at=old), **extra.get("h1", {})),
        host("h2", 8000, ready("v2", 6000, loaded_at=old), **extra.get("h2", {})),
    ]


def _victim_profiles() -> list:  # type: ignore[type-arg]
    return [
        profile("v1", 6000, min_replicas=1, min_residency_s=0.0),
        profile("v2", 6000, min_replicas=1, min_residency_s=0.0),
    ]


def _evicted_hosts(hosts: list, beneficiary) -> list[str]:  # type: ignore[no-untyped-def,type-arg]
    inputs = PlanInputs(
        now=NOW,
        hosts=tuple(hosts),
        profiles=(*_victim_profiles(), beneficiary),
        policy=POLICY,
    )
    p = real_plan(inputs, HOOKS)
    return sorted({e.host_id for e in p.evictions if e.beneficiary == beneficiary.model_id})


def test_equally_disruptive_victims_prefer_the_host_where_the_beneficiary_starts_soonest() -> None:
    b = profile("b", 6000, min_replicas=1, priority=10, artifact_sha256=SHA)
    # Nothing distinguishes the hosts: the deterministic tie-break picks the first.
    assert _evicted_hosts(_full_hosts(), b) == ["h1"]
    # h2 already has the beneficiary's exact weights: it serves sooner from there.
    assert _evicted_hosts(_full_hosts(h2={"cached": {"b": SHA}}), b) == ["h2"]
    # Weights of an unknown digest are not the beneficiary's: no preference.
    assert _evicted_hosts(_full_hosts(h2={"cached": {"b": None}}), b) == ["h1"]
    # Learned timings: the beneficiary warms far faster on h2.
    fast = {"b": ModelPerformance(warm_s=1.0, load_s=1.0)}
    assert _evicted_hosts(_full_hosts(h2={"performance": fast}), b) == ["h2"]


def _eviction(victim: str, host_id: str, beneficiary: str) -> Eviction:
    return Eviction(
        model_id=victim, host_id=host_id, beneficiary=beneficiary, priority=10, reason="preemption"
    )


def test_tight_budget_finishes_the_group_with_fewest_remaining_transitions() -> None:
    # Beneficiary b needs two ready victims gone from h1 (4 transitions); c needs one from
    # h2 (2 transitions). With one mutation slot, c's release completes first.
    hosts = [
        host("h1", 16_000, ready("v1", 6000), ready("v2", 6000)),
        host("h2", 16_000, ready("v3", 6000)),
    ]
    p = plan(
        {},
        evictions=(
            _eviction("v1", "h1", "b"),
            _eviction("v2", "h1", "b"),
            _eviction("v3", "h2", "c"),
        ),
        desired={"b": 1, "c": 1},
    )
    profiles = [profile(m, 6000) for m in ("v1", "v2", "v3")]
    profiles += [profile("b", 6000, priority=10), profile("c", 6000, priority=10)]
    r = run(p, hosts, profiles)
    left = {(x.model_id, x.host_id): x.group_left for x in r.proposals}
    assert left == {("v1", "h1"): 4, ("v2", "h1"): 4, ("v3", "h2"): 2}
    adm = admit(r.proposals, [], r.free_mb, GovernorPolicy(max_global_mutations=1))
    assert [(x.kind, x.model_id) for x in adm.admitted] == [("drain", "v3")]


def test_preemption_drains_carry_the_beneficiary_round() -> None:
    # b already holds two placed replicas: its eviction serves its third (round 2). Peer p
    # (same priority) misses two replicas: rounds 0 and 1 go before b's round 2.
    hosts = [
        host("h1", 16_000, ready("b", 4000)),
        host("h2", 16_000, ready("b", 4000)),
        host("h3", 8000, ready("v", 6000)),
        host("h4", 16_000),
        host("h5", 16_000),
    ]
    p = plan(
        {"b": ["h1", "h2"], "p": ["h4", "h5"]},
        evictions=(_eviction("v", "h3", "b"),),
        desired={"b": 3, "p": 2},
    )
    profiles = [profile("b", priority=10), profile("p", priority=10), profile("v", 6000)]
    r = run(p, hosts, profiles)
    rounds = sorted((x.kind, x.model_id, x.round) for x in r.proposals)
    assert rounds == [("drain", "v", 2), ("warm", "p", 0), ("warm", "p", 1)]
    adm = admit(r.proposals, [], r.free_mb, GovernorPolicy(max_global_mutations=2))
    assert [(x.kind, x.model_id) for x in adm.admitted] == [("warm", "p"), ("warm", "p")]


def _warm_prop(model: str, priority: int = 5) -> Proposal:
    return Proposal(
        kind="warm", host_id="h1", model_id=model, memory_mb=100, reason="r", priority=priority
    )


def test_withdrawal_takes_a_leaf_first_and_never_a_delivered_member() -> None:
    pair = [
        Action(action_id="l1", kind="load", host_id="h1", model_id="pair", delivered_at=NOW),
        Action(action_id="w1", kind="warm", host_id="h1", model_id="pair", memory_mb=100),
    ]
    leaf = [Action(action_id="w2", kind="warm", host_id="h1", model_id="leaf", memory_mb=100)]
    policy = GovernorPolicy(max_global_mutations=2, max_host_mutations=2)
    adm = admit([_warm_prop("urgent")], pair + leaf, {"h1": 50_000}, policy)
    assert adm.preempted == ["w2"] and [x.model_id for x in adm.admitted] == ["urgent"]
    # Only the pair holds slots and its load is running: nothing is withdrawn, the urgent
    # warm waits (the delivered load is never cancelled).
    one = GovernorPolicy(max_global_mutations=1, max_host_mutations=1)
    adm = admit([_warm_prop("urgent")], pair, {"h1": 50_000}, one)
    assert adm.preempted == [] and adm.admitted == []
    assert adm.deferred[0].reason == "host_mutation_limit"
    # An undelivered pair (nothing started) may be withdrawn whole; a leaf of cached weights
    # goes before it among equals.
    fresh_pair = [
        Action(action_id="l3", kind="load", host_id="h1", model_id="pair2"),
        Action(action_id="w3", kind="warm", host_id="h1", model_id="pair2", memory_mb=100),
    ]
    adm = admit([_warm_prop("urgent")], fresh_pair + leaf, {"h1": 50_000}, policy)
    assert adm.preempted == ["w2"]
    adm = admit([_warm_prop("urgent")], fresh_pair, {"h1": 50_000}, one)
    assert sorted(adm.preempted) == ["l3", "w3"]


def test_a_cooldown_held_replica_count_cannot_open_a_new_slot() -> None:
    m = profile("m", 4000, max_replicas=3)
    hosts = (host("h1", 16_000, ready("m", 4000)), host("h2", 16_000), host("h3", 16_000))

    def placed(held: int) -> list[str]:
        demand = {
            "m": ModelDemand(
                model_id="m", desired_replicas=2, held_replicas=held, direct=True, ready_replicas=1
            )
        }
        inputs = PlanInputs(now=NOW, hosts=hosts, profiles=(m,), demand=demand, policy=POLICY)
        return sorted(a.host_id for a in real_plan(inputs, HOOKS).assignments)

    assert placed(held=0) == ["h1", "h2"]  # demand asks for two: a second replica opens
    assert placed(held=1) == ["h1"]  # the cooldown only keeps what runs


def test_a_delivered_constructive_action_is_never_cancelled() -> None:
    book = ActionBook()
    book.add(
        Action(action_id="w-sent", kind="warm", host_id="h1", model_id="gone", delivered_at=NOW)
    )
    book.add(Action(action_id="w-queued", kind="warm", host_id="h2", model_id="gone"))
    r = run(plan({}), [host("h1"), host("h2")], [profile("gone")], book=book)
    assert [(w.action_id, w.status) for w in r.withdrawals] == [("w-queued", "cancelled")]
    assert deferred(r)[("cancel", "h1", "gone")] == "delivered_not_cancelled:no_longer_desired"
