"""Simulated nodes apply a real node's fences; request physics is deterministic."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid_core.demand.features import RequestFeatures
from grid_core.scenario.arrivals import Arrival, FleetEvents
from grid_core.scenario.catalog import build_catalog
from grid_core.scenario.fleet import Order, SimFleet
from grid_core.scenario.serving import serve_minute
from grid_core.scenario.topology import CLASSES, Machine

START = 1_000_000.0
NO_EVENTS = FleetEvents((), (), (0, 0), (0, 0))


def _fleet(*kinds: str, events: FleetEvents = NO_EVENTS, cached=()) -> SimFleet:
    by_name = {c.name: c for c in CLASSES}
    machines = tuple(
        Machine(f"h{i}", by_name[k], "fd-0", tuple(cached)) for i, k in enumerate(kinds)
    )
    return SimFleet(machines, build_catalog(16), events, START)


def _profiles(fleet: SimFleet) -> dict:
    return {m: e.profile for m, e in fleet.entries.items()}


def _start(fleet: SimFleet, host: str, model: str) -> None:
    p = _profiles(fleet)
    fleet.apply(Order(f"l-{host}-{model}", "load", host, model), p)
    fleet.apply(Order(f"w-{host}-{model}", "warm", host, model), p)


def test_a_started_model_is_ready_one_tick_later() -> None:
    fleet = _fleet("rtx-4090")
    fleet.advance(0)
    _start(fleet, "h0", "general-8b")
    assert fleet.nodes["h0"].residencies["general-8b"].state == "loading"
    fleet.advance(1)
    assert fleet.nodes["h0"].residencies["general-8b"].state == "ready"
    assert [a.status for a in fleet.take_acks("h0")] == ["succeeded"]


def test_removal_waits_for_minimum_residency() -> None:
    fleet = _fleet("rtx-4090")
    fleet.advance(0)
    _start(fleet, "h0", "general-8b")
    fleet.advance(1)
    ack = fleet.apply(Order("u1", "unload", "h0", "general-8b"), _profiles(fleet))
    assert ack.status == "running"  # deferred: loaded 60 s ago, minimum residency is 300 s
    assert "general-8b" in fleet.nodes["h0"].residencies
    fleet.advance(4)
    assert "general-8b" in fleet.nodes["h0"].residencies
    fleet.advance(5)
    assert "general-8b" not in fleet.nodes["h0"].residencies
    assert fleet.counters.deferred_unloads == 1
    assert ("u1", "succeeded") in [(a.action_id, a.status) for a in fleet.take_acks("h0")]


def test_overcommit_and_ineligible_orders_are_refused_and_counted() -> None:
    fleet = _fleet("mac-mini-24")
    fleet.advance(0)
    p = _profiles(fleet)
    # vLLM-only/CUDA model on an Apple machine: ineligible.
    assert fleet.apply(Order("x", "warm", "h0", "video-wan"), p).status == "rejected"
    _start(fleet, "h0", "general-8b")
    # The single model slot is taken.
    fleet.apply(Order("l2", "load", "h0", "code-7b"), p)
    assert fleet.apply(Order("w2", "warm", "h0", "code-7b"), p).status == "rejected"
    assert fleet.counters.violations == {"ineligible_placement": 1, "overcommit": 1}
    assert list(fleet.nodes["h0"].residencies) == ["general-8b"]


def test_downloads_consume_disk_that_persists_through_an_outage() -> None:
    events = FleetEvents((), ("h0",), (0, 0), (2, 4))
    fleet = _fleet("rtx-4090", events=events)
    fleet.advance(0)
    before = fleet.nodes["h0"].disk_used_mb
    _start(fleet, "h0", "code-14b")
    grown = fleet.nodes["h0"].disk_used_mb
    assert grown > before and fleet.counters.downloads == 1
    fleet.advance(2)
    assert not fleet.nodes["h0"].online and fleet.nodes["h0"].residencies == {}
    fleet.advance(4)
    assert fleet.nodes["h0"].online and fleet.nodes["h0"].disk_used_mb == grown
    _start(fleet, "h0", "code-14b")  # cached now: a cache hit, no second download
    assert fleet.counters.downloads == 1 and fleet.counters.cache_hits == 1


def test_a_down_machine_stops_heartbeating() -> None:
    events = FleetEvents((), ("h0",), (0, 0), (1, 3))
    fleet = _fleet("rtx-4090", "mac-mini-24", events=events)
    fleet.advance(0)
    fleet.advance(2)
    ages = {s.host_id: s.heartbeat_age_s for s in fleet.snapshots()}
    assert ages == {"h0": 120.0, "h1": 0.0}  # last beat at tick 0


def test_removing_the_last_ready_replica_in_use_is_a_violation_unless_preempted() -> None:
    fleet = _fleet("rtx-4090", "rtx-4090")
    fleet.advance(0)
    _start(fleet, "h0", "general-8b")
    _start(fleet, "h1", "code-14b")
    fleet.advance(10)
    fleet.demanded = {"general-8b", "code-14b"}
    p = _profiles(fleet)
    fleet.apply(Order("d1", "drain", "h0", "general-8b"), p)
    fleet.apply(Order("d2", "drain", "h1", "code-14b", reason="eviction"), p)
    assert fleet.counters.violations == {"last_replica_loss": 1}
    assert fleet.counters.preemptions == 1


def _arrival(
    offset: float,
    model: str = "auto",
    persona: str = "coding",
    endpoint: str = "chat",
    modality: str = "text",
    out: int = 250,
) -> Arrival:
    return Arrival(0, offset, 0, persona, model, endpoint, modality, 800, out, 0, 0)


def test_overload_queues_then_fails_deterministically() -> None:
    fleet = _fleet("mac-mini-24")
    fleet.advance(0)
    _start(fleet, "h0", "code-7b")
    fleet.advance(1)
    batch = tuple(_arrival(i * 0.1) for i in range(60))

    def classify(f: RequestFeatures, text: str) -> str:
        return "coding"

    def serve():
        return serve_minute(fleet, batch, lambda a: "fix this bug", classify, random.Random(1))

    results, features, pools = serve()
    outcomes = [r.outcome for r in results]
    assert outcomes[0] == "ok" and outcomes[-1] == "rejected"
    first_fail = outcomes.index("rejected")
    assert all(o == "ok" for o in outcomes[:first_fail])
    assert pools["code-7b"].queued > 0
    assert any(f.queue_s > 0 for f in features)
    again, _, _ = serve()
    assert [r.outcome for r in again] == outcomes


def test_unbound_requests_go_to_the_best_ready_model_and_named_ones_to_theirs() -> None:
    fleet = _fleet("rtx-4090", "rtx-4090")
    fleet.advance(0)
    _start(fleet, "h0", "general-8b")
    _start(fleet, "h1", "code-14b")
    fleet.advance(1)
    batch = (
        _arrival(1.0),
        _arrival(2.0, model="general-8b"),
        _arrival(3.0, persona="image", endpoint="image", modality="image", out=1),
    )

    def classify(f: RequestFeatures, text: str) -> str:
        return "image" if f.modality == "image" else "coding"

    results, _, _ = serve_minute(fleet, batch, lambda a: "", classify, random.Random(2))
    assert [(r.model, r.outcome) for r in results] == [
        ("code-14b", "ok"),
        ("general-8b", "ok"),
        (None, "unavailable"),
    ]


def test_unbound_requests_follow_the_portfolio_choice_like_the_router() -> None:
    """Grid's router sends an ``auto`` request to the model the allocator's portfolio maps
    its workload to when that model is ready, else to the best configured score; the lab
    routes the same way, so a model the portfolio moved a workload away from stops
    receiving that workload's traffic (and the queue it would report)."""
    fleet = _fleet("rtx-4090", "rtx-4090")
    fleet.advance(0)
    _start(fleet, "h0", "general-8b")
    _start(fleet, "h1", "code-14b")
    fleet.advance(1)
    batch = (_arrival(1.0), _arrival(2.0, persona="general"))

    def classify(f: RequestFeatures, text: str) -> str:
        return "coding"

    def served(chosen: dict[str, str]) -> list[str | None]:
        results, _, _ = serve_minute(fleet, batch, lambda a: "", classify, random.Random(2), chosen)
        return [r.model for r in results]

    assert served({"coding": "general-8b"}) == ["general-8b", "general-8b"]
    # A choice that is not ready (still loading, or gone) falls back to configured scores.
    assert served({"coding": "code-32b"}) == ["code-14b", "code-14b"]
    assert served({}) == ["code-14b", "code-14b"]


@pytest.mark.parametrize("kind", [c.name for c in CLASSES])
def test_every_machine_class_reports_a_consistent_snapshot(kind: str) -> None:
    fleet = _fleet(kind)
    fleet.advance(0)
    (snap,) = fleet.snapshots()
    assert snap.max_models == 1 and snap.capacity_mb > snap.reserved_mb
    assert snap.artifact_disk_free_mb is not None and snap.artifact_disk_free_mb > 0


def test_features_carry_only_bounded_fields_and_a_hashed_session() -> None:
    fleet = _fleet("rtx-4090")
    fleet.advance(0)
    batch = (
        _arrival(1.0),
        _arrival(2.0),
        Arrival(0, 3.0, 9, "coding", "auto", "chat", "text", 800, 250, 0, 1),
    )
    _, features, _ = serve_minute(
        fleet, batch, lambda a: "secret prompt text", lambda f, t: "coding", random.Random(3)
    )
    hashes = [f.affinity_hash for f in features]
    assert hashes[0] == hashes[1] != hashes[2] and len(hashes[0]) == 32
    assert all("secret" not in repr(f) for f in features)
    assert [f.outcome for f in features] == ["unavailable"] * 3


MODELS = [e.model_id for e in build_catalog(16)]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["load", "warm", "drain", "unload", "evict", "tick"]),
            st.integers(0, 2),
            st.sampled_from(MODELS),
        ),
        max_size=60,
    )
)
def test_no_order_sequence_breaks_the_node_fences(steps) -> None:
    events = FleetEvents(("h1",), ("h2",), (3, 9), (5, 8))
    fleet = _fleet("mac-mini-24", "rtx-4090", "media-48", events=events)
    tick = 0
    fleet.advance(tick)
    profiles = _profiles(fleet)
    for n, (kind, host, model) in enumerate(steps):
        if kind == "tick":
            tick += 1
            fleet.advance(tick)
        else:
            fleet.apply(Order(f"a{n}", kind, f"h{host}", model), profiles)
        for node in fleet.nodes.values():
            k = node.machine.kind
            assert len(node.residencies) <= 1
            assert node.used_mb() <= k.capacity_mb - k.reserved_mb
            assert node.disk_used_mb <= k.disk_mb
            assert node.online or not node.residencies
            for r in node.residencies.values():
                assert r.state != "ready" or fleet.tick >= r.ready_tick
                # A removal never materialises before the model's minimum residency.
                assert (
                    r.unload_after is None
                    or r.unload_after >= r.loaded_at + profiles[r.model_id].min_residency_s
                )
