"""Eligibility, memory and disk ledgers, model slots and colocation: one test per rule.

Source: specification, "Global placement loop" and "Safety invariants" 1 and 2.
"""

from __future__ import annotations

import pytest
from planner_helpers import GB, codes, host, model, placed, res, run

from grid_core.planner import PlannerPolicy
from grid_core.testing import plugins_with


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
    policy = PlannerPolicy(
        admission_headroom_mb=0, admission_headroom_fraction=0.0, throttled_fraction=0.5
    )
    p = run([model("m", 10, min_replicas=1)], [host("a", 16, state="throttled")], policy=policy)
    assert p.assignments == ()
    p = run([model("m", 6, min_replicas=1)], [host("a", 16, state="throttled")], policy=policy)
    assert placed(p) == {("m", "a")}


def test_host_reported_throttle_fraction_limits_new_placement():
    h = host("a", 16, throttle_fraction=0.25)  # 4 GB offered for new work
    assert run([model("m", 6, min_replicas=1)], [h]).assignments == ()
    assert placed(run([model("m", 3, min_replicas=1)], [h])) == {("m", "a")}


def test_raw_ledger_drops_lowest_priority_incumbent_when_reserve_grows():
    h = host("a", 16, reserved_mb=6 * GB, residencies=(res("hi", 6), res("lo", 6)))
    peer = host("b", 16, failure_domain="fd-2")
    p = run([model("hi", 6, min_replicas=1, priority=2), model("lo", 6, min_replicas=1)], [h, peer])
    assert ("hi", "a") in placed(p) and ("lo", "b") in placed(p)
    assert ("lo", "a") not in placed(p)


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
