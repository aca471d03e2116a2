"""One test per placement rule of the "Global placement loop" and invariants 1, 2, 5, 10."""

from __future__ import annotations

import pytest
from planner_helpers import GB, NOW, POLICY, codes, demand, host, model, placed, res, run

from grid_core.planner import PlanInputs, PlannerPolicy, input_digest, plan
from grid_core.testing import plugins_with

# --- eligibility (invariant 2) -------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"state": "paused"},
        {"state": "draining"},
        {"state": "unhealthy"},
        {"state": "quarantined"},
        {"heartbeat_age_s": 600.0},
        {"heartbeat_age_s": None},
        {"heartbeat_age_s": -120.0},
        {"healthy": False},
        {"authenticated": False},
    ],
)
def test_ineligible_host_gets_nothing_new(kw):
    p = run([model("m", min_replicas=1)], [host("a", **kw), host("b", 8)])
    assert placed(p) == {("m", "b")}


@pytest.mark.parametrize(
    ("prof", "hostkw"),
    [
        ({"runtimes": ("vllm",)}, {}),
        ({"backends": ("cuda",)}, {"backends": ("metal",)}),
        ({"data_tier": "secret"}, {"data_tiers": ("public",)}),
        ({"required_tags": ("ecc",)}, {"tags": ("office",)}),
        ({"forbidden_tags": ("office",)}, {"tags": ("office",)}),
        ({"min_gpu_count": 2}, {"gpu_count": 1}),
        ({"min_gpu_memory_mb": 24 * GB}, {"gpu_count": 1, "gpu_memory_mb": 16 * GB}),
    ],
)
def test_static_rules_are_hard(prof, hostkw):
    p = run([model("m", min_replicas=1, **prof)], [host("a", **hostkw)])
    assert p.assignments == ()
    assert codes(p, "m") == ["no_eligible_host"]


def test_future_heartbeat_within_skew_is_accepted():
    p = run([model("m", min_replicas=1)], [host("a", heartbeat_age_s=-2.0)])
    assert placed(p) == {("m", "a")}


# --- memory ledgers (invariant 1) -----------------------------------------------------------


def test_resident_model_memory_is_counted_for_a_second_model():
    h = host("a", 16, residencies=(res("big", 10),))
    p = run([model("big", 10, min_replicas=1), model("other", 8, min_replicas=1)], [h])
    assert placed(p) == {("big", "a")}
    assert codes(p, "other") == ["capacity_shortage"]


def test_reserve_and_thermal_derating_bound_the_desired_footprint():
    h = host("a", 16, reserved_mb=4 * GB, thermal_derating=0.25)  # 16 - 4 - 4 = 8 GB
    p = run([model("x", 6, min_replicas=1), model("y", 3, min_replicas=1)], [h])
    assert len(p.assignments) == 1


def test_admission_headroom_fences_new_allocations_only():
    full = host("a", 8, residencies=(res("m", 8),))
    policy = PlannerPolicy(admission_headroom_mb=512)
    # The incumbent is re-admitted although no headroom is left beside it ...
    assert placed(run([model("m", 8, min_replicas=1)], [full], policy=policy)) == {("m", "a")}
    # ... but a new 8 GB replica needs 8 GB plus the headroom.
    p = run([model("m", 8, min_replicas=1)], [host("b", 8)], policy=policy)
    assert p.assignments == ()


def test_unmanaged_resident_work_consumes_capacity_first():
    h = host("a", 16, external_used_mb=6 * GB, residencies=(res("ext", 4, ownership="external"),))
    p = run([model("m", 8, min_replicas=1)], [h])
    assert p.assignments == ()
    p = run([model("m", 6, min_replicas=1)], [h])
    assert placed(p) == {("m", "a")}


def test_obsolete_live_process_blocks_new_memory_until_unloaded():
    # make-before-break: memory held by a replica nobody wants is still live memory.
    h = host("a", 16, residencies=(res("old", 12, state="draining"),))
    p = run([model("new", 8, min_replicas=1)], [h], plugins=plugins_with())
    assert p.assignments == ()


def test_throttled_host_offers_only_its_fraction():
    policy = PlannerPolicy(admission_headroom_mb=0, throttled_fraction=0.5)
    p = run([model("m", 10, min_replicas=1)], [host("a", 16, state="throttled")], policy=policy)
    assert p.assignments == ()
    p = run([model("m", 6, min_replicas=1)], [host("a", 16, state="throttled")], policy=policy)
    assert placed(p) == {("m", "a")}


def test_raw_ledger_drops_lowest_priority_incumbent_when_reserve_grows():
    h = host("a", 16, reserved_mb=6 * GB, residencies=(res("hi", 6), res("lo", 6)))
    peer = host("b", 16, failure_domain="fd-2")
    p = run([model("hi", 6, min_replicas=1, priority=2), model("lo", 6, min_replicas=1)], [h, peer])
    assert ("hi", "a") in placed(p) and ("lo", "b") in placed(p)
    assert ("lo", "a") not in placed(p)


# --- disk -----------------------------------------------------------------------------------


def test_uncached_artifacts_reserve_disk_cumulatively():
    h = host("a", 64, artifact_disk_free_mb=10 * GB)
    ms = [model(f"m{i}", 4, min_replicas=1, artifact_size_mb=6 * GB) for i in range(2)]
    p = run(ms, [h])
    assert len(p.assignments) == 1
    assert "disk_shortage" in codes(p)


def test_exact_cached_weights_pay_no_disk():
    sha = "ab" * 32
    h = host("a", 64, artifact_disk_free_mb=1 * GB, cached={"m": sha})
    p = run([model("m", 4, min_replicas=1, artifact_size_mb=6 * GB, artifact_sha256=sha)], [h])
    assert placed(p) == {("m", "a")}
    other = host("a", 64, artifact_disk_free_mb=1 * GB, cached={"m": "cd" * 32})
    p = run([model("m", 4, min_replicas=1, artifact_size_mb=6 * GB, artifact_sha256=sha)], [other])
    assert p.assignments == ()


# --- slots and colocation -------------------------------------------------------------------


def test_model_slot_limit():
    h = host("a", 64, max_models=1, residencies=(res("x", 4),))
    p = run([model("x", 4, min_replicas=1), model("y", 4, min_replicas=1)], [h])
    assert placed(p) == {("x", "a")}
    assert codes(p, "y") == ["slot_limit"]


def test_exclusive_model_counts_itself_and_is_reciprocal():
    hosts = [host("a", 64)]
    p = run(
        [
            model("solo", 4, min_replicas=1, max_colocated_models=1, priority=1),
            model("peer", 4, min_replicas=1),
        ],
        hosts,
    )
    assert placed(p) == {("solo", "a")}
    assert codes(p, "peer") == ["colocation_conflict"]


def test_colocation_exclude_is_reciprocal_even_declared_on_one_side():
    hosts = [host("a", 64), host("b", 64, failure_domain="fd-2")]
    p = run(
        [
            model("x", 4, min_replicas=1, colocation_excludes=("y",)),
            model("y", 4, min_replicas=2, max_replicas=2, priority=1),
        ],
        hosts,
    )
    assert len(p.hosts_of("y")) == 2
    x_hosts = set(p.hosts_of("x"))
    assert not x_hosts & set(p.hosts_of("y"))
    assert codes(p, "x") == ["colocation_conflict"]


# --- pins -----------------------------------------------------------------------------------


def test_pin_whose_host_is_offline_is_reported_and_never_substituted():
    # The pin alone asks for the replica: it is not started elsewhere, the pin is reported.
    hosts = [host("a", 64, state="paused"), host("b", 64)]
    p = run([model("m", 4, pins=("a",))], hosts)
    assert p.assignments == ()
    [u] = p.unmet
    assert (u.code, u.resource, u.host_id, u.missing) == ("pin_unavailable", "pin", "a", 1)


def test_offline_pin_does_not_starve_the_baseline_it_does_not_own():
    # min_replicas=1 is demand of its own: it is placed on another host; the pin is reported
    # as a constraint shortfall with no replica missing.
    hosts = [host("a", 64, state="paused"), host("b", 64)]
    p = run([model("m", 4, min_replicas=1, pins=("a",))], hosts)
    assert placed(p) == {("m", "b")}
    [u] = p.unmet
    assert (u.code, u.host_id, u.missing) == ("pin_unavailable", "a", 0)


def test_pins_are_reserved_before_higher_priority_work():
    hosts = [host("a", 8)]
    p = run(
        [
            model("pinned", 6, min_replicas=1, pins=("a",)),
            model("vip", 6, min_replicas=1, priority=5),
        ],
        hosts,
    )
    assert placed(p) == {("pinned", "a")}


def test_missing_pin_preempts_only_on_its_exact_host():
    a = host("a", 8, residencies=(res("lo", 6),))
    b = host("b", 8, residencies=(res("lo2", 6),))
    p = run(
        [
            model("pinned", 6, min_replicas=1, pins=("a",), priority=3),
            model("lo", 6, min_replicas=1),
            model("lo2", 6, min_replicas=1),
        ],
        [a, b],
    )
    assert [(e.model_id, e.host_id) for e in p.evictions] == [("lo", "a")]
    assert codes(p, "pinned") == ["preemption_staged"]


# --- priority and fairness ------------------------------------------------------------------


def test_higher_priority_class_fills_first():
    p = run(
        [model("a-low", 8, min_replicas=1), model("z-high", 8, min_replicas=1, priority=2)],
        [host("h", 8)],
    )
    assert placed(p) == {("z-high", "h")}


def test_fair_rounds_give_each_model_a_replica_before_seconds():
    hosts = [host(f"h{i}", 8, failure_domain=f"fd-{i}") for i in range(3)]
    p = run(
        [model("a", 6, max_replicas=3), model("b", 6, max_replicas=3)],
        hosts,
        [demand("a", 3), demand("b", 3)],
    )
    counts = {m: len(p.hosts_of(m)) for m in ("a", "b")}
    assert sorted(counts.values()) == [1, 2]


def test_renaming_identical_models_does_not_move_the_scarce_slot():
    hosts = [host("h", 8)]
    for hurt, calm in (("alpha", "omega"), ("omega", "alpha")):
        p = run(
            [model("alpha", 6, max_replicas=1), model("omega", 6, max_replicas=1)],
            hosts,
            [
                demand(hurt, 1, queue_depth=5.0, request_rate_rps=1.0),
                demand(calm, 1, request_rate_rps=1.0),
            ],
        )
        assert placed(p) == {(hurt, "h")}, (hurt, calm)


def test_harm_order_latency_ratio_then_errors():
    hosts = [host("h", 8)]
    slo = {"latency_slo_ms": 1000.0}
    p = run(
        [model("a", 6, **slo), model("b", 6, **slo)],
        hosts,
        [demand("a", 1, p95_ms=900.0, error_rate=0.5), demand("b", 1, p95_ms=3000.0)],
    )
    assert placed(p) == {("b", "h")}


def test_baseline_replicas_place_before_demand_extras():
    hosts = [host(f"h{i}", 8) for i in range(2)]
    p = run(
        [model("busy", 6, max_replicas=2), model("base", 6, min_replicas=1)],
        hosts,
        [demand("busy", 2, request_rate_rps=9.0, queue_depth=9.0)],
    )
    assert set(p.hosts_of("base")) and len(p.hosts_of("busy")) == 1


def test_never_exceeds_max_replicas():
    hosts = [host(f"h{i}", 8) for i in range(5)]
    p = run([model("m", 2, max_replicas=2)], hosts, [demand("m", 9)])
    assert len(p.assignments) == 2 and p.desired == {"m": 2}


# --- failure domains ------------------------------------------------------------------------


def test_failure_domain_diversity_is_reserved_before_scoring():
    sha = "ab" * 32
    hosts = [
        host("a1", 16, cached={"m": sha}),
        host("a2", 16, cached={"m": sha}),
        host("b1", 16, failure_domain="fd-2"),
    ]
    p = run(
        [model("m", 4, min_replicas=2, max_replicas=2, min_failure_domains=2, artifact_sha256=sha)],
        hosts,
    )
    assert set(p.hosts_of("m")) in ({"a1", "b1"}, {"a2", "b1"})


def test_failure_domain_shortfall_is_reported():
    hosts = [host("a1", 16), host("a2", 16)]
    p = run([model("m", 4, min_replicas=2, max_replicas=2, min_failure_domains=2)], hosts)
    assert len(p.assignments) == 2
    assert codes(p, "m") == ["failure_domain_shortfall"]


# --- scoring --------------------------------------------------------------------------------


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


# --- stability ------------------------------------------------------------------------------


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
    from grid_core.planner import _solve, canonical_inputs
    from grid_core.planner.core import PlanState

    hosts = [host(f"h{i}", 8, failure_domain=f"fd-{i}") for i in range(8)]
    profiles = [model(f"m{i}", 6, min_replicas=4, max_replicas=4) for i in range(4)]
    inputs = canonical_inputs(
        PlanInputs(now=NOW, profiles=tuple(profiles), hosts=tuple(hosts), policy=POLICY)
    )
    state = PlanState(inputs, [], None)
    result = _solve(state, "x")
    assert len(result.assignments) == 8
    assert sum(u.missing for u in result.unmet) == 8
    assert state.repair_steps == 0


# --- preemption (invariant 3 exception) -----------------------------------------------------


def test_three_small_idle_residencies_evict_the_smallest_sufficient_set():
    h = host("a", 12, residencies=(res("s1", 4), res("s2", 4), res("s3", 4)))
    profiles = [model("big", 8, min_replicas=1, priority=3)] + [
        model(f"s{i}", 4, min_replicas=1) for i in (1, 2, 3)
    ]
    p = run(profiles, [h])
    assert len(p.evictions) == 2
    assert {e.beneficiary for e in p.evictions} == {"big"}
    assert all(e.priority == 3 for e in p.evictions)
    assert "big" not in {a.model_id for a in p.assignments}


def test_staged_preemption_never_assigns_before_memory_is_proven_free():
    profiles = [model("vip", 8, min_replicas=1, priority=3), model("lo", 8, min_replicas=1)]
    first = run(profiles, [host("a", 8, residencies=(res("lo", 8),))])
    assert [(e.model_id, e.beneficiary) for e in first.evictions] == [("lo", "vip")]
    assert first.hosts_of("vip") == () and codes(first, "vip") == ["preemption_staged"]
    draining = run(profiles, [host("a", 8, residencies=(res("lo", 8, state="draining"),))])
    assert draining.hosts_of("vip") == ()
    assert codes(draining, "vip") == ["preemption_staged"]
    freed = run(profiles, [host("a", 8)])
    assert freed.hosts_of("vip") == ("a",) and freed.evictions == ()


def test_preemption_prefers_failed_and_idle_victims():
    busy = res("busy", 8, active_requests=3)
    failed = res("broken", 8, state="failed")
    hosts = [host("a", 8, residencies=(busy,)), host("b", 8, residencies=(failed,))]
    profiles = [
        model("vip", 8, min_replicas=1, priority=3),
        model("busy", 8, min_replicas=1),
        model("broken", 8, min_replicas=1),
    ]
    p = run(profiles, hosts)
    assert [(e.model_id, e.host_id) for e in p.evictions] == [("broken", "b")]


@pytest.mark.parametrize(
    "kw",
    [
        {"ownership": "external"},
        {"ownership": "manual"},
        {"ownership": "pinned"},
        {"loaded_at": NOW - 5.0},
    ],
)
def test_protected_work_is_never_a_victim(kw):
    h = host("a", 8, residencies=(res("lo", 8, **kw),))
    p = run([model("vip", 8, min_replicas=1, priority=3), model("lo", 8, min_replicas=1)], [h])
    assert p.evictions == ()
    assert codes(p, "vip") == ["capacity_shortage"]


def test_equal_priority_work_is_not_preempted():
    h = host("a", 8, residencies=(res("peer", 8),))
    p = run([model("new", 8, min_replicas=1), model("peer", 8, min_replicas=1)], [h])
    assert p.evictions == ()


def test_inferred_only_demand_cannot_preempt():
    h = host("a", 8, residencies=(res("lo", 8),))
    p = run(
        [model("guess", 8, priority=3), model("lo", 8, min_replicas=1)],
        [h],
        [demand("guess", 1, direct=False, inferred_rps=1.0)],
    )
    assert p.evictions == ()


def test_eviction_budget_bounds_one_plan():
    hosts = [host(f"h{i:03d}", 8, residencies=(res(f"lo{i}", 8),)) for i in range(70)]
    profiles = [model("vip", 8, min_replicas=70, max_replicas=70, priority=3)] + [
        model(f"lo{i}", 8, min_replicas=1) for i in range(70)
    ]
    p = run(profiles, hosts, policy=PlannerPolicy(admission_headroom_mb=0))
    assert len(p.evictions) == 64
    assert {u.code for u in p.unmet if u.model_id == "vip"} == {
        "preemption_staged",
        "eviction_budget",
    }


def test_lowered_model_ceiling_converges_by_evicting_the_lowest_priority():
    h = host("a", 64, max_models=1, residencies=(res("hi", 4), res("lo", 4)))
    p = run([model("hi", 4, min_replicas=1, priority=2), model("lo", 4, min_replicas=1)], [h])
    assert placed(p) == {("hi", "a")}
    assert [(e.model_id, e.reason) for e in p.evictions] == [("lo", "ceiling")]


# --- output ---------------------------------------------------------------------------------


def test_digest_is_stable_and_order_independent():
    profiles = [model("a", 4, min_replicas=1), model("b", 4, min_replicas=1)]
    hosts = [host("x", 16), host("y", 16, failure_domain="fd-2")]
    one = PlanInputs(now=NOW, profiles=tuple(profiles), hosts=tuple(hosts), policy=POLICY)
    two = PlanInputs(
        now=NOW, profiles=tuple(reversed(profiles)), hosts=tuple(reversed(hosts)), policy=POLICY
    )
    assert input_digest(one) == input_digest(two)
    hooks = plugins_with().planner_hooks()
    assert plan(one, hooks, reuse=False) == plan(two, hooks, reuse=False)
    later = PlanInputs(now=NOW + 1, profiles=tuple(profiles), hosts=tuple(hosts), policy=POLICY)
    assert input_digest(later) != input_digest(one)


def test_identical_inputs_reuse_the_plan():
    plugins = plugins_with()
    inputs = PlanInputs(
        now=NOW, profiles=(model("a", 4, min_replicas=1),), hosts=(host("x", 16),), policy=POLICY
    )
    assert plan(inputs, plugins.planner_hooks()) is plan(inputs, plugins.planner_hooks())


def test_duplicate_ids_are_refused():
    from grid_core.errors import ValidationError

    with pytest.raises(ValidationError, match="listed twice"):
        run([model("a")], [host("x"), host("x")])


def test_worked_example_of_docs_planner_md():
    def fleet(c_state: str, b_res: tuple = ()):
        return [
            host("mac-a", 24, reserved_mb=6 * GB, residencies=(res("chat", 8),)),
            host("mac-b", 24, reserved_mb=6 * GB, failure_domain="fd-2", residencies=b_res),
            host("gpu-c", 32, failure_domain="fd-2", state=c_state),
        ]

    profiles = [
        model("chat", 8, min_replicas=1, max_replicas=3, min_failure_domains=2, priority=1),
        model("code", 12, min_replicas=1, max_replicas=2, priority=1),
        model("embed", 2, min_replicas=1),
    ]
    wants = [demand("chat", 2, queue_depth=2.0), demand("code", 2)]
    p = run(profiles, fleet("paused"), wants)
    assert placed(p) == {("chat", "mac-a"), ("code", "mac-b"), ("embed", "mac-b")}
    assert sorted((u.model_id, u.code) for u in p.unmet) == [
        ("chat", "capacity_shortage"),
        ("chat", "failure_domain_shortfall"),
        ("code", "capacity_shortage"),
    ]
    later = run(profiles, fleet("accepting", (res("code", 12), res("embed", 2))), wants)
    assert placed(later) == {
        ("chat", "mac-a"),
        ("chat", "gpu-c"),
        ("code", "mac-b"),
        ("code", "gpu-c"),
        ("embed", "mac-b"),
    }
    assert later.unmet == ()


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


def test_inferred_only_demand_waits_behind_direct_demand():
    hosts = [host("h", 8)]
    p = run(
        [model("a-guess", 6), model("z-real", 6)],
        hosts,
        [
            demand("a-guess", 1, direct=False, inferred_rps=5.0, queue_depth=0.0),
            demand("z-real", 1, request_rate_rps=0.1),
        ],
    )
    assert placed(p) == {("z-real", "h")}


def test_unwanted_replica_inside_min_residency_is_not_preempted():
    fresh = res("surplus", 8, loaded_at=NOW - 30.0)
    h = host("a", 8, residencies=(fresh,))
    profiles = [model("vip", 8, min_replicas=1, priority=3), model("surplus", 8)]
    assert run(profiles, [h]).evictions == ()
    old = host("a", 8, residencies=(res("surplus", 8),))
    assert [e.model_id for e in run(profiles, [old]).evictions] == ["surplus"]


def test_incumbents_in_one_domain_make_room_for_a_required_second_domain():
    hosts = [
        host("a1", 16, residencies=(res("m", 4),)),
        host("a2", 16, residencies=(res("m", 4),)),
        host("b1", 16, failure_domain="fd-2"),
    ]
    profile = model("m", 4, min_replicas=2, max_replicas=2, min_failure_domains=2)
    p = run([profile], hosts)
    assert placed(p) == {("m", "a1"), ("m", "b1")}
    assert p.unmet == ()
    # Without room in the other domain both incumbents stay and the shortfall is reported.
    full = [*hosts[:2], host("b1", 16, failure_domain="fd-2", state="paused")]
    p = run([profile], full)
    assert placed(p) == {("m", "a1"), ("m", "a2")}
    assert codes(p, "m") == ["failure_domain_shortfall"]
    tight = [*hosts[:2], host("b1", 2, failure_domain="fd-2")]
    p = run([profile], tight)
    assert placed(p) == {("m", "a1"), ("m", "a2")}
    assert codes(p, "m") == ["failure_domain_shortfall"]


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


def test_eviction_budget_is_shared_one_replica_per_model_per_round():
    hosts = [
        host(f"h{i}", 8, failure_domain=f"fd-{i}", residencies=(res(f"lo{i}", 8),))
        for i in range(4)
    ]
    profiles = [
        model("a", 8, min_replicas=2, max_replicas=2, priority=3),
        model("b", 8, min_replicas=2, max_replicas=2, priority=3),
    ] + [model(f"lo{i}", 8, min_replicas=1) for i in range(4)]
    p = run(profiles, hosts, policy=PlannerPolicy(admission_headroom_mb=0, max_evictions=2))
    assert sorted(e.beneficiary for e in p.evictions) == ["a", "b"]


def test_host_reported_throttle_fraction_limits_new_placement():
    h = host("a", 16, throttle_fraction=0.25)  # 4 GB offered for new work
    assert run([model("m", 6, min_replicas=1)], [h]).assignments == ()
    assert placed(run([model("m", 3, min_replicas=1)], [h])) == {("m", "a")}


def test_sole_feasible_host_relocates_an_equal_priority_incumbent_make_before_break():
    profiles = [
        model("gpu", 10, min_replicas=1, backends=("cuda",)),
        model("flex", 10, min_replicas=1),
    ]
    cuda = {"backends": ("cuda",)}
    # Tick 1: "flex" holds the only cuda host; it is assigned a new home, nothing is evicted.
    hosts = [host("cuda-1", 16, residencies=(res("flex", 10),), **cuda), host("mac", 32)]
    p = run(profiles, hosts)
    assert placed(p) == {("flex", "mac")}
    assert p.evictions == ()
    [u] = p.unmet
    assert (u.code, u.model_id, u.host_id) == ("relocation_staged", "gpu", "cuda-1")
    # Tick 2: the new copy is ready; the plan keeps it and still keeps cuda-1 for "gpu".
    hosts = [
        host("cuda-1", 16, residencies=(res("flex", 10),), **cuda),
        host("mac", 32, residencies=(res("flex", 10),)),
    ]
    p = run(profiles, hosts)
    assert placed(p) == {("flex", "mac")}
    assert [u.code for u in p.unmet] == ["relocation_staged"]
    # Tick 3: the old copy is gone: "gpu" lands on its only host.
    hosts = [host("cuda-1", 16, **cuda), host("mac", 32, residencies=(res("flex", 10),))]
    p = run(profiles, hosts)
    assert placed(p) == {("flex", "mac"), ("gpu", "cuda-1")} and p.unmet == ()


def test_relocation_needs_a_destination():
    profiles = [
        model("gpu", 10, min_replicas=1, backends=("cuda",)),
        model("flex", 10, min_replicas=1),
    ]
    hosts = [host("cuda-1", 16, backends=("cuda",), residencies=(res("flex", 10),)), host("mac", 8)]
    p = run(profiles, hosts)
    assert placed(p) == {("flex", "cuda-1")}
    assert codes(p, "gpu") == ["capacity_shortage"]


def test_a_loading_copy_beside_a_draining_one_is_the_incumbent():
    h = host("a", 16, residencies=(res("m", 4, state="draining"), res("m", 4, state="loading")))
    p = run([model("m", 4, min_replicas=1)], [h])
    assert placed(p) == {("m", "a")} and p.assignments[0].incumbent


# --- packing quality (issue 17) -------------------------------------------------------------


def _cuda(host_id: str, gb: float, **kw: object):
    return host(
        host_id, gb, runtimes=("llama.cpp", "vllm"), backends=("cuda",), tags=("nvidia",), **kw
    )


def test_minimal_slot_case_places_all_five_models():
    # Four single-slot 24 GB CUDA hosts, one 192 GB Mac without a slot ceiling, four 2 GB
    # priority-2 GGUF models and one 12 GB priority-0 CUDA-only model. Slot-blind best fit
    # filled the CUDA hosts with the small models and dropped the CUDA one; the optimum
    # places all five.
    hosts = [_cuda(f"cuda-{i}", 24, max_models=1) for i in range(1, 5)]
    hosts.append(host("mac", 192, backends=("metal",), tags=("apple-silicon",)))
    profiles = [model(f"gguf-{i}", 2, min_replicas=1, priority=2) for i in range(1, 5)]
    profiles.append(
        model("cuda-only", 12, min_replicas=1, priority=0, runtimes=("vllm",), backends=("cuda",))
    )
    p = run(profiles, hosts)
    assert p.unmet == ()
    assert {a.model_id for a in p.assignments} == {m.model_id for m in profiles}
    [cuda_host] = p.hosts_of("cuda-only")
    assert cuda_host.startswith("cuda-")


def test_minimal_slot_case_when_higher_priority_demand_fills_every_slot():
    # Same fleet, but the small models ask for 2 replicas each (8 in all, one per host): the
    # Mac takes 4 and the four CUDA slots the other 4, in priority order.
    hosts = [_cuda(f"cuda-{i}", 24, max_models=1) for i in range(1, 5)]
    hosts.append(host("mac", 192, backends=("metal",), tags=("apple-silicon",)))
    profiles = [model(f"gguf-{i}", 2, max_replicas=2, priority=2) for i in range(1, 5)]
    profiles.append(
        model("cuda-only", 12, min_replicas=1, priority=0, runtimes=("vllm",), backends=("cuda",))
    )
    wants = [demand(f"gguf-{i}", 2) for i in range(1, 5)]
    p = run(profiles, hosts, wants)
    # priority 2 comes first: 4 on the Mac + 4 on the CUDA hosts fill every slot, so the
    # priority-0 model is short, and the reason names the binding resource: model slots.
    assert len(p.assignments) == 8
    [u] = p.unmet
    assert (u.model_id, u.code, u.resource, u.missing) == ("cuda-only", "slot_limit", "slots", 1)


def test_pins_are_a_floor_not_a_ceiling():
    # The pin guarantees a replica on "pinned" (reserved first); demand beyond it (3) is
    # placed on the other eligible hosts.
    hosts = [host("pinned", 16), host("b", 16), host("c", 16), host("d", 16)]
    p = run([model("m", 4, max_replicas=4, pins=("pinned",))], hosts, [demand("m", 3)])
    assert p.desired["m"] == 3
    assert "pinned" in p.hosts_of("m") and len(p.hosts_of("m")) == 3
    assert [a.reason for a in p.assignments if a.host_id == "pinned"] == ["pin"]
    assert p.unmet == ()


def test_pin_is_reserved_before_other_demand_takes_its_host():
    # "other" is more important and would fit the pinned host too, but the pin is first.
    hosts = [host("pinned", 8), host("b", 8)]
    p = run(
        [
            model("m", 6, pins=("pinned",)),
            model("other", 6, min_replicas=2, max_replicas=2, priority=3),
        ],
        hosts,
    )
    assert ("m", "pinned") in placed(p)
    assert [(u.model_id, u.resource) for u in p.unmet] == [("other", "memory")]


def test_pin_floor_respects_tags_beyond_the_pin():
    # Demand beyond the pin may only use hosts the profile's tags allow.
    hosts = [
        host("pinned", 16, tags=("gpu",)),
        host("tagged", 16, tags=("gpu",)),
        host("plain", 16),
    ]
    p = run(
        [model("m", 4, max_replicas=3, pins=("pinned",), required_tags=("gpu",))],
        hosts,
        [demand("m", 3)],
    )
    assert set(p.hosts_of("m")) == {"pinned", "tagged"}
    [u] = p.unmet
    assert (u.code, u.resource, u.missing) == ("host_shortage", "tags", 1)


def test_unmet_reason_names_slots_when_memory_is_free():
    # Plenty of memory, one slot per host: the shortfall is about model slots, not memory.
    hosts = [host("a", 64, max_models=1), host("b", 64, max_models=1)]
    p = run(
        [model("x", 4, min_replicas=2, max_replicas=2, priority=1), model("y", 4, min_replicas=1)],
        hosts,
    )
    [u] = p.unmet
    assert (u.model_id, u.code, u.resource) == ("y", "slot_limit", "slots")
    assert "model slots" in u.message


def test_unmet_reason_names_runtime_when_no_host_can_run_the_model():
    hosts = [host("a", 64), host("b", 64)]
    p = run([model("v", 4, min_replicas=1, runtimes=("vllm",))], hosts)
    [u] = p.unmet
    assert (u.code, u.resource) == ("no_eligible_host", "runtime")
