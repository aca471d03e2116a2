"""Pins, priority classes, fair rounds and failure domains: one test per rule.

Source: specification, "Global placement loop" and "Safety invariants" 5 and 7.
"""

from __future__ import annotations

from planner_helpers import codes, demand, host, model, placed, res, run


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
