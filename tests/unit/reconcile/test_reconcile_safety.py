"""Reconciler safety rules: make before break, drain before unload, ownership, fences."""

from __future__ import annotations

from reconcile_helpers import NOW, deferred, host, kinds, plan, profile, ready, run

from grid_core.planner.types import Eviction
from grid_core.reconcile import Action, ActionBook
from grid_core.snapshot import ResidencySnapshot


def test_replacement_is_warmed_before_the_obsolete_replica_drains() -> None:
    p = plan({"a": ["h2"]})
    hosts = [host("h1", 16_000, ready("a")), host("h2")]
    r = run(p, hosts, [profile("a", min_replicas=1)])
    assert kinds(r) == [("warm", "h2", "a")]
    assert r.proposals[0].load_first  # not cached there: load, then warm
    assert deferred(r)[("drain", "h1", "a")] == "replacement_not_ready"

    # Ready but not yet corroborated by an engine record: still no proof.
    hosts[1] = host("h2", 16_000, ready("a", routable=False))
    assert (
        deferred(run(p, hosts, [profile("a", min_replicas=1)]))[("drain", "h1", "a")]
        == "replacement_not_routable"
    )

    hosts[1] = host("h2", 16_000, ready("a"))
    assert kinds(run(p, hosts, [profile("a", min_replicas=1)])) == [("drain", "h1", "a")]


def test_a_plan_below_min_replicas_cannot_drain_the_last_replica() -> None:
    r = run(plan({}), [host("h1", 16_000, ready("a"))], [profile("a", min_replicas=1)])
    assert kinds(r) == []
    assert deferred(r)[("drain", "h1", "a")] == "replacement_missing"


def test_cached_exact_weights_skip_the_load_and_a_digest_mismatch_does_not() -> None:
    sha, other = "a" * 64, "b" * 64
    prof = profile("a", artifact_sha256=sha)
    r = run(plan({"a": ["h1"]}), [host("h1", cached={"a": sha})], [prof])
    assert [(p.kind, p.load_first) for p in r.proposals] == [("warm", False)]
    r = run(plan({"a": ["h1"]}), [host("h1", cached={"a": other})], [prof])
    assert [(p.kind, p.load_first) for p in r.proposals] == [("warm", True)]


def test_unload_waits_for_known_zero_in_flight_requests() -> None:
    def draining(active: int | None) -> ResidencySnapshot:
        return ready("a", state="draining", active_requests=active)

    p = plan({"a": ["h2"]})
    other = host("h2", 16_000, ready("a"))
    prof = [profile("a", min_replicas=1)]
    assert (
        deferred(run(p, [host("h1", 16_000, draining(2)), other], prof))[("unload", "h1", "a")]
        == "in_flight"
    )
    assert (
        deferred(run(p, [host("h1", 16_000, draining(None)), other], prof))[("unload", "h1", "a")]
        == "activity_unknown"
    )
    assert kinds(run(p, [host("h1", 16_000, draining(0)), other], prof)) == [("unload", "h1", "a")]


def test_external_manual_and_pinned_engines_are_never_actuated() -> None:
    res = [
        ready("x", ownership="external"),
        ready("y", ownership="manual", mb=2000),
        ready("z", ownership="pinned", mb=2000),
    ]
    r = run(plan({}), [host("h1", 16_000, *res)], [])
    assert r.proposals == [] and r.deferred == []


def test_unauthenticated_external_record_cannot_prove_a_replacement() -> None:
    p = plan({"a": ["h2"]})
    hosts = [
        host("h1", 16_000, ready("a")),
        host("h2", 16_000, ready("a", ownership="external"), authenticated=False),
    ]
    r = run(p, hosts, [profile("a", min_replicas=1)])
    assert deferred(r)[("drain", "h1", "a")] == "replacement_unauthenticated"


def test_minimum_residency_delays_a_drain_but_not_a_staged_preemption() -> None:
    young = ready("a", loaded_at=NOW - 10.0)
    p = plan({"b": ["h2"]})
    hosts = [host("h1", 16_000, young), host("h2", 16_000, ready("b"))]
    profiles = [profile("a", min_residency_s=300.0), profile("b")]
    assert deferred(run(p, hosts, profiles))[("drain", "h1", "a")] == "min_residency"

    ev = Eviction(model_id="a", host_id="h1", beneficiary="b", priority=5, reason="preempt")
    r = run(plan({"b": ["h2"]}, evictions=(ev,)), hosts, profiles)
    (drain,) = r.proposals
    assert (drain.kind, drain.eviction, drain.priority, drain.beneficiary) == (
        "drain",
        True,
        5,
        "b",
    )


def test_retired_model_drains_without_replacement_and_cancels_its_loads() -> None:
    book = ActionBook(
        [Action(action_id="l1", kind="load", host_id="h2", model_id="a", created_at=NOW - 5)]
    )
    r = run(plan({}), [host("h1", 16_000, ready("a")), host("h2")], [], book=book, retired={"a"})
    assert kinds(r) == [("drain", "h1", "a")]
    assert [(w.action_id, w.status, w.reason) for w in r.withdrawals] == [
        ("l1", "cancelled", "retired")
    ]


def test_hosts_that_cannot_take_commands_get_none() -> None:
    p = plan({"a": ["h1", "h2", "h3"]})
    hosts = [
        host("h1", state="paused"),
        host("h2", heartbeat_age_s=600.0),
        host("h3", healthy=False),
    ]
    r = run(p, hosts, [profile("a", max_replicas=3)])
    assert r.proposals == []
    assert set(deferred(r).values()) == {"host_not_admitting"}


def test_replica_on_an_owner_reclaimed_host_may_drain_without_a_replacement() -> None:
    r = run(
        plan({"a": ["h2"]}),
        [host("h1", 16_000, ready("a"), state="paused"), host("h2")],
        [profile("a", min_replicas=1)],
    )
    assert ("drain", "h1", "a") in kinds(r)


def test_warm_waits_for_memory_including_in_flight_warms_the_snapshot_does_not_show() -> None:
    book = ActionBook(
        [
            Action(
                action_id="w0",
                kind="warm",
                host_id="h1",
                model_id="b",
                memory_mb=8000,
                delivered_at=NOW - 1,
            )
        ]
    )
    r = run(
        plan({"a": ["h1"], "b": ["h1"]}),
        [host("h1", 12_000)],
        [profile("a"), profile("b")],
        book=book,
    )
    assert r.free_mb["h1"] == 4000
    # The governor turns this into "awaiting_memory"; the reconciler reports the ledger.
    assert [p.memory_mb for p in r.proposals] == [4000]


def test_cached_weights_of_a_retired_model_are_evicted_where_the_node_can() -> None:
    able = host("h1", cached={"a": None}, actuator_capabilities=("load", "warm", "evict"))
    unable = host("h2", cached={"a": None}, actuator_capabilities=("load", "warm"))
    r = run(plan({}), [able, unable], [], retired={"a"})
    assert kinds(r) == [("evict", "h1", "a")]
    # Configured models keep their cache.
    assert kinds(run(plan({}), [able], [profile("a")])) == []


def test_a_warm_that_succeeded_after_the_last_report_still_holds_its_memory() -> None:
    done = Action(
        action_id="w0",
        kind="warm",
        host_id="h1",
        model_id="b",
        memory_mb=8000,
        status="succeeded",
        delivered_at=NOW - 9,
        completed_at=NOW - 2,
        receipt_at=NOW - 2,
    )
    book = ActionBook([done])
    p = plan({"a": ["h1"], "b": ["h1"]})
    old_report = host("h1", 12_000, heartbeat_age_s=5.0)  # sent before the receipt
    assert run(p, [old_report], [profile("a"), profile("b")], book=book).free_mb["h1"] == 4000
    # A newer report without the process means it is gone: the memory is free again.
    new_report = host("h1", 12_000, heartbeat_age_s=1.0)
    assert run(p, [new_report], [profile("a"), profile("b")], book=book).free_mb["h1"] == 12_000


def test_preemption_fetches_the_beneficiarys_authorized_weights_before_draining() -> None:
    sha = "e" * 64
    big = profile(
        "b",
        artifact_sha256=sha,
        artifact_source="hf://o/r/b.gguf",
        artifact_size_mb=3000,
        priority=5,
    )
    ev = Eviction(model_id="a", host_id="h1", beneficiary="b", priority=5, reason="preempt")
    p = plan({}, evictions=(ev,), desired={"b": 1})
    r = run(p, [host("h1", 8000, ready("a"))], [profile("a"), big])
    assert kinds(r) == [("load", "h1", "b")]
    assert r.proposals[0].artifact_source == "hf://o/r/b.gguf"
    assert deferred(r)[("drain", "h1", "a")] == "prefetching_beneficiary"
    # The pending prefetch is not cancelled as "not desired" while the preemption stands.
    book = ActionBook(
        [Action(action_id="pf", kind="load", host_id="h1", model_id="b", reason="prefetch")]
    )
    assert run(p, [host("h1", 8000, ready("a"))], [profile("a"), big], book=book).withdrawals == []
    # Once the exact weights are cached on disk the victim drains.
    cached = host("h1", 8000, ready("a"), cached={"b": sha})
    assert kinds(run(p, [cached], [profile("a"), big])) == [("drain", "h1", "a")]
