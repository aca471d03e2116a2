"""Scoring and stability: soft preferences, kept incumbents and fragmentation repair.

Source: specification, "Global placement loop" and "Safety invariants" 10.
"""

from __future__ import annotations

from planner_helpers import NOW, PLUGINS, POLICY, demand, host, model, placed, res, run

from grid_core.planner import PlanInputs, canonical_inputs
from grid_core.planner.core import PlanState
from grid_core.testing import plugins_with


def test_cached_weights_beat_an_empty_faster_host():
    sha = "ab" * 32
    hosts = [
        host("cold", 16, memory_bandwidth_gbps=800.0, compute_gflops=100_000.0),
        host("warm", 16, cached={"m": sha}),
    ]
    p = run([model("m", 4, min_replicas=1, artifact_sha256=sha)], hosts)
    assert placed(p) == {("m", "warm")}


def test_hardware_prior_breaks_cold_ties():
    hosts = [host("a", 16), host("b", 16, memory_bandwidth_gbps=800.0)]
    p = run([model("m", 4, min_replicas=1)], hosts)
    assert placed(p) == {("m", "b")}


def test_best_fit_prefers_the_tighter_host():
    p = run([model("m", 6, min_replicas=1)], [host("big", 64), host("small", 8)])
    assert placed(p) == {("m", "small")}


def test_hot_demand_amortizes_a_measured_faster_cold_host():
    from grid_core.snapshot import ModelPerformance

    sha = "ab" * 32
    fast = ModelPerformance(tokens_per_s=200.0, samples=8)
    hosts = [host("cached", 16, cached={"m": sha}), host("fast", 16, performance={"m": fast})]
    prof = model("m", 4, max_replicas=1, artifact_sha256=sha)
    light = run([prof], hosts, [demand("m", 1, offered_concurrency=0.5)])
    hot = run([prof], hosts, [demand("m", 1, offered_concurrency=40.0)])
    assert placed(light) == {("m", "cached")}
    assert placed(hot) == {("m", "fast")}


def test_throttled_and_busy_hosts_score_lower():
    hosts = [host("busy", 16, queue_depth=8, concurrency=4), host("calm", 16)]
    assert placed(run([model("m", 4, min_replicas=1)], hosts)) == {("m", "calm")}


def test_score_terms_are_collected_once_per_plan():
    calls = {"n": 0}

    class Term:
        name = "counting"
        dynamic = False

        def score(self, model, host, ctx):
            return 0.0

    class Mod:
        from grid_core import hookimpl

        @staticmethod
        @hookimpl
        def grid_placement_score_terms(register):
            calls["n"] += 1
            register(Term())

    plugins = plugins_with(("counting", Mod))
    hosts = [host(f"h{i}", 16) for i in range(4)]
    run([model(f"m{i}", 2, min_replicas=1) for i in range(4)], hosts, plugins=plugins)
    run([model(f"m{i}", 2, min_replicas=1) for i in range(4)], hosts, plugins=plugins)
    assert calls["n"] == 1


def test_static_terms_run_once_per_model_and_host_class():
    seen: list[tuple[str, str]] = []

    class Term:
        name = "recording"
        dynamic = False

        def score(self, model, host, ctx):
            seen.append((model.model_id, host.host_id))
            return 0.0

    class Mod:
        from grid_core import hookimpl

        @staticmethod
        @hookimpl
        def grid_placement_score_terms(register):
            register(Term())

    hosts = [host(f"h{i}", 16, failure_domain=f"fd-{i % 3}") for i in range(6)]
    hosts.append(host("odd", 32))
    profiles = [model("a", 2, max_replicas=5), model("b", 2, max_replicas=5)]
    p = run(
        profiles, hosts, [demand("a", 5), demand("b", 5)], plugins=plugins_with(("recording", Mod))
    )
    assert len(p.assignments) == 10
    # two host classes (the six identical hosts, and "odd") x two models
    assert sorted(set(seen)) == sorted(seen) and len(seen) == 4


def test_complete_current_placement_is_kept_over_better_hosts():
    hosts = [
        host("slow", 64, residencies=(res("m", 4),)),
        host("fast", 8, memory_bandwidth_gbps=800.0, failure_domain="fd-2"),
    ]
    p = run([model("m", 4, min_replicas=1)], hosts)
    assert placed(p) == {("m", "slow")}
    assert p.assignments[0].incumbent and p.assignments[0].reason == "incumbent"


def test_scale_down_keeps_replicas_in_min_residency_first():
    fresh = res("m", 4, loaded_at=NOW - 10.0)
    old = res("m", 4, loaded_at=NOW - 9000.0)
    hosts = [host("a", 16, residencies=(old,)), host("b", 16, residencies=(fresh,))]
    p = run([model("m", 4, max_replicas=2)], hosts, [demand("m", 1)])
    assert placed(p) == {("m", "b")}


def test_fragmentation_is_avoided_or_repaired_for_equal_priority_replicas():
    # Best fit alone puts the larger "q" on the tight host and "p" then lacks a second
    # domain; scarcity pricing (or, failing it, repair) keeps the tight host for "p".
    hosts = [host("tight", 8, failure_domain="fd-1"), host("roomy", 12, failure_domain="fd-2")]
    profiles = [
        model("p", 4, min_replicas=2, max_replicas=2, min_failure_domains=2),
        model("q", 8, min_replicas=1),
    ]
    p = run(profiles, hosts)
    assert placed(p) == {("p", "tight"), ("p", "roomy"), ("q", "roomy")}
    assert p.unmet == ()


def test_higher_priority_replica_leaves_the_only_host_a_lower_priority_model_fits():
    # "small" (priority 2) is placed first and best fit alone would send it to the
    # single-slot host that "big" (priority 0) needs; scarcity pricing keeps it free.
    hosts = [
        host("one-slot", 16, max_models=1, backends=("cuda",)),
        host("roomy", 64, backends=("metal",)),
    ]
    profiles = [
        model("small", 2, min_replicas=1, priority=2),
        model("big", 12, min_replicas=1, backends=("cuda",)),
    ]
    p = run(profiles, hosts)
    assert placed(p) == {("small", "roomy"), ("big", "one-slot")}
    assert p.unmet == ()


def test_saturated_homogeneous_fleet_fails_fast_without_repair_search():
    from grid_core.planner import _result, _solve, canonical_inputs
    from grid_core.planner.core import PlanState

    hosts = [host(f"h{i}", 8, failure_domain=f"fd-{i}") for i in range(8)]
    profiles = [model(f"m{i}", 6, min_replicas=4, max_replicas=4) for i in range(4)]
    inputs = canonical_inputs(
        PlanInputs(now=NOW, profiles=tuple(profiles), hosts=tuple(hosts), policy=POLICY)
    )
    state = PlanState(inputs, [], None)
    assert _solve(state)
    result = _result(state, "x")
    assert len(result.assignments) == 8
    assert sum(u.missing for u in result.unmet) == 8
    assert state.repair_steps == 0


def test_flexible_model_leaves_a_constrained_models_only_host():
    # "gpu" runs only on the cuda host; "any" (a higher class, placed first) fits both and
    # best fit alone would pick the tighter cuda host; scarcity sends it to the other one.
    hosts = [host("cuda", 16, backends=("cuda",)), host("mac", 32, backends=("metal",))]
    p = run(
        [
            model("any", 10, min_replicas=1, priority=1),
            model("gpu", 8, min_replicas=1, backends=("cuda",)),
        ],
        hosts,
    )
    assert placed(p) == {("any", "mac"), ("gpu", "cuda")}


def test_a_loading_copy_beside_a_draining_one_is_the_incumbent():
    h = host("a", 16, residencies=(res("m", 4, state="draining"), res("m", 4, state="loading")))
    p = run([model("m", 4, min_replicas=1)], [h])
    assert placed(p) == {("m", "a")} and p.assignments[0].incumbent


def test_untouched_hosts_of_one_class_share_fit_and_score_but_not_domain_or_learned_price():
    # Five identical hosts (one class) and a larger one: untouched books of one class share
    # the best-host memo entry only where the domain novelty and the learned price agree too.
    hosts = [
        host("h1", 16, failure_domain="fd-1"),
        host("h2", 16, failure_domain="fd-1"),
        host("h3", 16, failure_domain="fd-2"),
        host("h4", 16, failure_domain="fd-3"),
        host("h5", 32, failure_domain="fd-3"),
        host("h6", 16, failure_domain="fd-3"),
    ]
    profiles = (model("m", 4, min_replicas=3, max_replicas=3), model("n", 8))
    inputs = canonical_inputs(
        PlanInputs(now=NOW, profiles=profiles, hosts=tuple(hosts), policy=POLICY)
    )
    state = PlanState(inputs, list(PLUGINS.planner_hooks().score_terms), None)
    state.learned = [(0.0, 0.0), (0.0, 0.0), (1.0, 0.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)]
    state.prepare_scarcity()
    state.ledger.place(0, 3, "score")  # m on h4: fd-3 is no longer new for m
    found = state.best_host(0)
    assert found is not None
    row = state._fit[0]
    assert row is not None
    for hi in (0, 1, 2, 4, 5):  # h4 holds m now
        domain_new = state.ledger.domain_list[hi] not in state.ledger.domains[0]
        got = row[hi]
        assert (got.version, got.why, got.domain_new) == (
            state.ledger.books[hi].version,
            None,
            domain_new,
        )
        assert (got.score, got.prices) == state.scored(0, hi, domain_new)
    # h1 and h2 share one entry; h3 (learned price), h5 (another class) and h6 (its domain
    # is not new) have their own
    assert len(state.opening_fit) == 4
    assert row[0] is row[1]
