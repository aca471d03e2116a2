"""Admission headroom grows with the model's size (issue 20): a floor for small models, a
share of the resident budget for large ones, overridable per profile, and the same rule in
the planner, its explanation and the exact optimum."""

from __future__ import annotations

import msgspec
import pytest
from planner_helpers import GB, codes, host, model, placed, res, run

from grid_core.errors import ValidationError
from grid_core.headroom import (
    ADMISSION_HEADROOM_FRACTION,
    ADMISSION_HEADROOM_MB,
    admission_headroom_mb,
)
from grid_core.planner import PlanInputs, PlannerPolicy
from grid_core.planner.exact import exact_optimum
from grid_core.planner.explain import explain

DEFAULT = PlannerPolicy()
"""The shipped policy: 512 MB floor, a tenth of the replica's resident budget."""


def test_headroom_is_the_floor_for_small_models_and_a_share_for_large_ones():
    assert admission_headroom_mb(1024) == ADMISSION_HEADROOM_MB == 512
    assert admission_headroom_mb(14_950) == 1495  # ceil(0.10 * 14 950)
    assert ADMISSION_HEADROOM_FRACTION == 0.10
    # A profile override replaces the share but never goes under the host's floor.
    assert admission_headroom_mb(14_950, override_mb=600) == 600
    assert admission_headroom_mb(14_950, override_mb=100) == 512
    assert admission_headroom_mb(1024, override_mb=4096) == 4096
    assert admission_headroom_mb(8192, floor_mb=0, fraction=0.0) == 0


def test_a_large_model_is_refused_a_host_with_only_a_flat_margin_left():
    # The field case: 14.6 GB resident on a host with 15.8 GB allocatable (8 % slack). A flat
    # 512 MB admitted it; its proportional headroom (1.5 GB) does not fit.
    big = model("big", 14_950 / GB, min_replicas=1)
    h = host("h1", 15_820 / GB)
    p = run([big], [h], policy=DEFAULT)
    assert p.assignments == ()
    assert codes(p, "big") == ["capacity_shortage"]
    # The same host with the old flat rule would have taken it.
    flat = PlannerPolicy(admission_headroom_fraction=0.0)
    assert placed(run([big], [h], policy=flat)) == {("big", "h1")}


def test_a_small_model_still_needs_only_the_floor():
    small = model("small", 1, min_replicas=1)
    assert placed(run([small], [host("h1", (1024 + 512) / GB)], policy=DEFAULT)) == {
        ("small", "h1")
    }
    assert run([small], [host("h1", (1024 + 511) / GB)], policy=DEFAULT).assignments == ()


def test_a_profile_override_admits_a_model_whose_operator_knows_it_needs_less():
    big = model("big", 14_950 / GB, min_replicas=1, admission_headroom_mb=600)
    assert placed(run([big], [host("h1", 15_820 / GB)], policy=DEFAULT)) == {("big", "h1")}
    # ... and one that needs more is kept off a host the default would have allowed.
    wide = model("wide", 4, min_replicas=1, admission_headroom_mb=4096)
    assert run([wide], [host("h1", 7.9)], policy=DEFAULT).assignments == ()
    assert placed(run([wide], [host("h1", 8)], policy=DEFAULT)) == {("wide", "h1")}


def test_a_later_small_replica_cannot_eat_the_headroom_of_a_large_one_on_the_same_host():
    # 16 GB needs 1.6 GB free; a 2 GB model fits beside it (19.6 <= 20), a 3 GB one does not
    # (20.6 > 20) even though its own 512 MB floor would.
    big = model("big", 16, min_replicas=1, priority=10)
    for size, fits in ((2, True), (3, False)):
        small = model("small", size, min_replicas=1)
        got = placed(run([big, small], [host("h1", 20)], policy=DEFAULT))
        assert ("big", "h1") in got
        assert (("small", "h1") in got) is fits, size


def test_an_incumbent_stays_inside_its_headroom():
    # Specification, invariant 1: a zero-allocation transition may keep a process in the margin.
    full = host("h1", 15_000 / GB, residencies=(res("big", 14_950 / GB),))
    big = model("big", 14_950 / GB, min_replicas=1)
    assert placed(run([big], [full], policy=DEFAULT)) == {("big", "h1")}


def test_explain_names_the_headroom_a_memory_verdict_needs():
    big = model("big", 14_950 / GB, min_replicas=1)
    hosts = [host("h1", 15_820 / GB)]
    p = run([big], hosts, policy=DEFAULT)
    e = explain("big", [big], hosts, p, None, DEFAULT)
    assert e.binding == "memory"
    detail = e.hosts[0].detail
    assert "needs 14950 MB" in detail and "1495 MB admission headroom" in detail, detail
    assert "15820 MB free for new work" in detail, detail


def test_a_negative_headroom_override_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="admission_headroom_mb"):
        model("m", 4, admission_headroom_mb=-1)


def test_the_exact_optimum_applies_the_same_headroom():
    # Two new replicas on one 20 GB host: the exact program may not let the small one eat the
    # large one's headroom either, so its optimum equals the planner's (1 of 2).
    big = model("big", 16, min_replicas=1, priority=10)
    small = model("small", 3, min_replicas=1)
    inputs = PlanInputs(
        now=1_800_000_000.0, profiles=(big, small), hosts=(host("h1", 20),), policy=DEFAULT
    )
    assert exact_optimum(inputs).optimum == 1
    flat = msgspec.structs.replace(inputs, policy=PlannerPolicy(admission_headroom_fraction=0.0))
    assert exact_optimum(flat).optimum == 2
