"""Model co-activation and inferred demand: thresholds, caps, no transitivity, no preemption."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from grid_core.demand.coactivation import (
    BUCKET_S,
    MAX_HISTORY_BUCKETS,
    MAX_SOURCES,
    MIN_SUPPORT,
    PEAK_CAP,
    CoActivationBook,
)
from grid_core.demand.inference import InferredDemand, apply_inferred, infer_demand
from grid_core.demand.sequence import SequenceBook
from grid_core.demand.types import ModelDemand
from grid_core.planner import plan
from grid_core.planner.hooks import PlannerHooks
from grid_core.planner.types import PlanInputs
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot

T0 = 1_700_000_040.0 - (1_700_000_040.0 % BUCKET_S)


def _minute(book: CoActivationBook, minute: int, **counts: int) -> None:
    for model, n in counts.items():
        for _ in range(n):
            book.observe(model, T0 + minute * BUCKET_S + 1)


def test_a_group_needs_three_buckets_and_the_threshold() -> None:
    book = CoActivationBook()
    for m in range(MIN_SUPPORT - 1):
        _minute(book, 2 * m, a=2, b=4)
    now = T0 + 100 * BUCKET_S
    assert book.associations(now) == []
    _minute(book, 10, a=2, b=4)
    groups = [x for x in book.associations(now) if x.kind == "group"]
    assert {(x.source, x.target) for x in groups} == {("a", "b"), ("b", "a")}
    # b usually without a: the association falls below 0.70 and the group is gone.
    for m in range(20, 26):
        _minute(book, m, b=1)
    assert [x for x in book.associations(now) if x.kind == "group"] == []


def test_a_pair_counts_the_next_bucket_and_ignores_the_incomplete_future() -> None:
    book = CoActivationBook()
    for m in (0, 5, 10):
        _minute(book, m, a=1)
        _minute(book, m + 1, b=1)
    _minute(book, 20, a=1)  # its next bucket is the current, incomplete one
    now = T0 + 21 * BUCKET_S + 5
    [pair] = [x for x in book.associations(now) if x.kind == "pair" and x.source == "a"]
    assert (pair.target, pair.support, pair.association) == ("b", 3, 1.0)


def test_inferred_rate_is_capped_at_twice_the_observed_peak() -> None:
    book = CoActivationBook()
    for m in range(0, 12, 3):
        _minute(book, m, a=1, b=3)
    now = T0 + 20 * BUCKET_S
    [row] = book.infer(now, {"a": 100.0})
    assert row.target == "b" and row.capped
    assert row.rate_rps == PEAK_CAP * 3 / BUCKET_S


def test_inference_takes_the_maximum_over_sources_never_the_sum() -> None:
    book = CoActivationBook()
    for m in range(0, 12, 3):
        _minute(book, m, a=1, c=1, b=4)
    now = T0 + 20 * BUCKET_S
    one = book.infer(now, {"a": 1 / BUCKET_S})
    both = book.infer(now, {"a": 1 / BUCKET_S, "c": 1 / BUCKET_S})
    assert [r.target for r in both] == ["b"]
    assert both[0].rate_rps == one[0].rate_rps


def test_never_transitive() -> None:
    book = CoActivationBook()
    for m in range(0, 40, 10):  # a, then b one minute later, then c one minute after b
        _minute(book, m, a=1)
        _minute(book, m + 1, b=1)
        _minute(book, m + 2, c=1)
    now = T0 + 60 * BUCKET_S
    assert {(x.source, x.target) for x in book.associations(now)} == {("a", "b"), ("b", "c")}
    # Only a has direct demand: b is inferred, and b's inference never reaches c.
    assert {r.target for r in book.infer(now, {"a": 0.05})} == {"b"}


@settings(max_examples=30, deadline=None)
@given(
    sources=st.dictionaries(
        st.sampled_from([f"s{i}" for i in range(40)]), st.floats(0.001, 10.0), max_size=40
    )
)
def test_at_most_32_sources_are_read(sources: dict[str, float]) -> None:
    book = CoActivationBook()
    for m in range(0, 12, 3):
        _minute(book, m, t=1, **{s: 1 for s in sources})
    rows = book.infer(T0 + 20 * BUCKET_S, sources)
    busiest = sorted(sources.items(), key=lambda x: (-x[1], x[0]))[:MAX_SOURCES]
    assert all(r.source in dict(busiest) for r in rows)


def test_history_is_bounded() -> None:
    book = CoActivationBook()
    for m in range(MAX_HISTORY_BUCKETS + 50):
        _minute(book, m, a=1)
    assert len(book.to_state()["buckets"]) == MAX_HISTORY_BUCKETS  # type: ignore[arg-type]  # a list


def _profile(mid: str, memory: int = 1000) -> ModelProfile:
    return ModelProfile(model_id=mid, memory_mb=memory, runtimes=("llama.cpp",), min_replicas=0)


def _one_slot_host(host_id: str) -> HostSnapshot:
    """A free 4,000 MB llama.cpp host with one model slot."""
    return HostSnapshot(
        host_id=host_id,
        capacity_mb=4000,
        heartbeat_age_s=1.0,
        runtimes=("llama.cpp",),
        max_models=1,
    )


def _plan_on(profiles: tuple[ModelProfile, ...], hosts: tuple[HostSnapshot, ...]):  # type: ignore[no-untyped-def]  # test helper
    """``plan_with_predictions``' planning callback over fixed profiles and hosts (nothing
    held, so the released replicas it names change nothing)."""

    def plan_of(d: dict[str, ModelDemand], released: frozenset):  # type: ignore[no-untyped-def, type-arg]  # test helper
        return plan(PlanInputs(now=T0, profiles=profiles, hosts=hosts, demand=d), PlannerHooks())

    return plan_of


def test_sequence_prediction_becomes_inferred_demand_with_its_edge() -> None:
    seq = SequenceBook()
    t = T0
    for i in range(6):
        seq.observe(f"s{i}", "a", t)
        seq.observe(f"s{i}", "b", t + 20)
        t += 60
    seq.observe("live", "a", t)
    demand = {"a": ModelDemand(model_id="a", direct=True), "b": ModelDemand(model_id="b")}
    [row] = infer_demand(seq, CoActivationBook(), demand, {}, t + 1)
    assert (row.model_id, row.kind, row.edge, row.confidence) == ("b", "sequence", "a→b", 1.0)
    out = apply_inferred(demand, [row], {"a": _profile("a"), "b": _profile("b")})
    assert out["b"].desired_replicas == 1 and not out["b"].direct
    assert out["b"].inferred_rps == row.rate_rps and "sequence" in out["b"].reasons
    assert out["a"] == demand["a"]  # direct evidence is never touched


def test_inferred_demand_never_preempts_direct_work() -> None:
    """One one-model host runs the direct model; the inferred model stays unplaced."""
    profiles = (_profile("direct"), _profile("guess"))
    host = HostSnapshot(
        host_id="h1",
        capacity_mb=4000,
        heartbeat_age_s=1.0,
        runtimes=("llama.cpp",),
        max_models=1,
        residencies=(
            ResidencySnapshot(
                model_id="direct",
                memory_mb=1000,
                state="ready",
                active_requests=0,
                loaded_at=T0 - 10_000,
                routable=True,
            ),
        ),
    )
    demand = {
        "direct": ModelDemand(model_id="direct", desired_replicas=1, direct=True),
        "guess": ModelDemand(model_id="guess"),
    }
    row = InferredDemand(
        model_id="guess", kind="pair", edge="x→guess", confidence=1.0, support=9, rate_rps=5.0
    )
    inferred = apply_inferred(demand, [row], {p.model_id: p for p in profiles})
    result = plan(
        PlanInputs(now=T0, profiles=profiles, hosts=(host,), demand=inferred), PlannerHooks()
    )
    assert [(a.host_id, a.model_id) for a in result.assignments] == [("h1", "direct")]
    assert not result.evictions
    # With a free second host the same inference uses the spare capacity.
    free = _one_slot_host("h2")
    result = plan(
        PlanInputs(now=T0, profiles=profiles, hosts=(host, free), demand=inferred),
        PlannerHooks(),
    )
    assert ("h2", "guess") in [(a.host_id, a.model_id) for a in result.assignments]


def test_a_prediction_never_displaces_what_the_plan_would_serve_without_it() -> None:
    """Workload projection is also non-direct demand; a predicted model must not take its
    spare slot. One free host: the projected model keeps it, the prediction gets none."""
    from grid_core.demand.inference import plan_with_predictions

    profiles = (_profile("projected"), _profile("guess"))
    demand = {
        "projected": ModelDemand(
            model_id="projected", desired_replicas=1, inferred_rps=0.01, reasons=("workload",)
        ),
        "guess": ModelDemand(model_id="guess"),
    }
    row = InferredDemand(
        model_id="guess", kind="sequence", edge="a→guess", confidence=1.0, support=9, rate_rps=9.0
    )

    plan_of = _plan_on(profiles, (_one_slot_host("h1"),))
    chosen, used = plan_with_predictions(plan_of, demand, [row], {p.model_id: p for p in profiles})
    assert [(a.host_id, a.model_id) for a in chosen.assignments] == [("h1", "projected")]
    assert used["guess"].desired_replicas == 0


def test_a_prediction_never_takes_the_host_of_a_model_that_also_has_real_demand() -> None:
    """A model with projected workload demand that also gets a prediction keeps the host the
    plan without predictions gave it. With both predicted, the planner's size order hands the
    one-model host to the larger model, whose only demand is a sequence guess; that plan
    is refused, so the guess gets no slot and the writer keeps its host."""
    from grid_core.demand.inference import plan_with_predictions

    profiles = (_profile("writer"), _profile("video", memory=3000))
    demand = {
        "writer": ModelDemand(
            model_id="writer", desired_replicas=1, inferred_rps=0.01, reasons=("workload",)
        ),
        "video": ModelDemand(model_id="video"),
    }
    rows = [
        InferredDemand(
            model_id=m, kind="sequence", edge=f"a→{m}", confidence=1.0, support=9, rate_rps=r
        )
        for m, r in (("writer", 0.5), ("video", 9.0))
    ]

    plan_of = _plan_on(profiles, (_one_slot_host("h1"),))
    chosen, used = plan_with_predictions(plan_of, demand, rows, {p.model_id: p for p in profiles})
    assert [(a.host_id, a.model_id) for a in chosen.assignments] == [("h1", "writer")]
    assert used["video"].desired_replicas == 0


def test_a_prediction_never_holds_a_released_replica_that_real_demand_is_waiting_for() -> None:
    """The lab's 4-machine seed-144 regression: a replica whose demand ended is released
    before real demand can take its one-model host (unload first, place later), so the
    waiting model is unmet, not assigned, in the plan without predictions. A sequence
    prediction for the released model must not keep it there: the plan without predictions
    is kept, and the next tick places the waiting model."""
    from grid_core.demand.inference import plan_with_predictions, without_residencies

    profiles = (_profile("waiting"), _profile("guess"))
    host = HostSnapshot(
        host_id="h1",
        capacity_mb=4000,
        heartbeat_age_s=1.0,
        runtimes=("llama.cpp",),
        max_models=1,
        residencies=(
            ResidencySnapshot(
                model_id="guess",
                memory_mb=1000,
                state="ready",
                active_requests=0,
                loaded_at=T0 - 10_000,
                routable=True,
            ),
        ),
    )
    demand = {
        "waiting": ModelDemand(model_id="waiting", desired_replicas=1, direct=True),
        "guess": ModelDemand(model_id="guess"),
    }
    row = InferredDemand(
        model_id="guess", kind="sequence", edge="a→guess", confidence=1.0, support=9, rate_rps=1.0
    )
    calls: list[frozenset[tuple[str, str]]] = []

    def plan_of(d: dict[str, ModelDemand], released: frozenset[tuple[str, str]]):  # type: ignore[no-untyped-def]  # test helper
        calls.append(released)
        hosts = without_residencies((host,), released)
        return plan(PlanInputs(now=T0, profiles=profiles, hosts=hosts, demand=d), PlannerHooks())

    base = plan_of(dict(demand), frozenset())
    assert not base.assignments and [u.model_id for u in base.unmet] == ["waiting"]
    calls.clear()
    chosen, used = plan_with_predictions(plan_of, demand, [row], {p.model_id: p for p in profiles})
    assert not chosen.assignments  # the release goes ahead; "guess" is not kept
    assert calls[-1] == {("guess", "h1")}  # the third plan: the held replica treated as gone
    assert used["guess"].desired_replicas == 0
    # Without anyone waiting the same prediction keeps the replica (spare capacity).
    alone = {"guess": ModelDemand(model_id="guess")}
    chosen, used = plan_with_predictions(plan_of, alone, [row], {p.model_id: p for p in profiles})
    assert [(a.host_id, a.model_id) for a in chosen.assignments] == [("h1", "guess")]
