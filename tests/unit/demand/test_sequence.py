"""Affinity-key sequence learning: proof, confidence, caps, expiry, ordering, lead time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from grid_core.demand.features import RequestFeatures
from grid_core.demand.sequence import (
    ACTIVE_CURSOR_S,
    EXPIRY_S,
    MAX_TRANSITIONS,
    MAX_WORKFLOWS,
    MIN_REPEATS,
    SequenceBook,
    stage_of,
)

T0 = 1_700_000_000.0


def _session(book: SequenceBook, key: str, stages: list[str], start: float, gap: float) -> float:
    t = start
    for s in stages:
        book.observe(key, s, t)
        t += gap
    return t


def test_five_repeats_are_needed_before_a_prediction() -> None:
    book = SequenceBook()
    t = T0
    for i in range(MIN_REPEATS - 1):
        t = _session(book, f"s{i}", ["a", "b"], t, 30.0)
    book.observe("live", "a", t)
    assert book.predict(t + 1) == []
    book = SequenceBook()
    t = T0
    for i in range(MIN_REPEATS):
        t = _session(book, f"s{i}", ["a", "b"], t, 30.0)
    book.observe("live", "a", t)
    [p] = book.predict(t + 1)
    assert (p.source, p.target, p.repeats, p.sessions) == ("a", "b", MIN_REPEATS, 1)
    assert p.edge == "a→b"
    assert p.lead_s == 30.0
    assert p.due_at == t + 30.0


def test_confidence_counts_every_departure_including_sessions_that_end() -> None:
    book = SequenceBook()
    t = T0
    for i in range(6):
        t = _session(book, f"ab{i}", ["a", "b"], t, 10.0)
    for i in range(6):
        t = _session(book, f"ac{i}", ["a", "c"], t, 10.0)
    assert book.confidence("a", "b") == 0.5
    # Sessions that stop at "a" (their cursor expires) are departures too.
    for i in range(4):
        book.observe(f"stop{i}", "a", t)
    book.expire(t + EXPIRY_S)
    # The learned edges are an hour old and forgotten; the four sessions that ended on "a"
    # are departures that went nowhere.
    assert book.departures("a") == 4
    assert book.confidence("a", "b") == 0.0
    book = SequenceBook()
    t = T0
    for i in range(6):
        t = _session(book, f"ab{i}", ["a", "b"], t, 10.0)
    for i in range(6):
        book.observe(f"stop{i}", "a", t)
    # Overflowing the cursor cap ends the oldest sessions on their stage.
    for i in range(MAX_WORKFLOWS):
        book.observe(f"other{i}", "z", t + 1)
    assert book.departures("a") == 12
    assert book.confidence("a", "b") == 0.5


def test_unrelated_sessions_adjacent_in_time_are_no_evidence() -> None:
    book = SequenceBook()
    t = T0
    for i in range(20):
        book.observe(f"image-user-{i}", "image", t)
        book.observe(f"video-user-{i}", "video", t + 1)
        t += 5
    assert book.edges() == []
    assert book.predict(t) == []


def test_out_of_order_and_simultaneous_completions_establish_no_order() -> None:
    book = SequenceBook()
    for i in range(10):
        book.observe("k", "b", T0 + 100 * i)
        assert not book.observe("k", "a", T0 + 100 * i - 50)  # arrived late
        assert not book.observe("k", "c", T0 + 100 * i)  # same instant
    assert book.edges() == []


def test_repeating_a_stage_only_moves_the_cursor() -> None:
    book = SequenceBook()
    for i in range(10):
        book.observe("k", "a", T0 + i)
    assert book.edges() == []


def test_inactive_sessions_do_not_predict_and_everything_expires_after_an_hour() -> None:
    book = SequenceBook()
    t = T0
    for i in range(MIN_REPEATS):
        t = _session(book, f"s{i}", ["a", "b"], t, 10.0)
    book.observe("live", "a", t)
    assert book.predict(t + ACTIVE_CURSOR_S - 1)
    assert book.predict(t + ACTIVE_CURSOR_S) == []
    book.expire(t + EXPIRY_S)
    assert book.edges() == [] and book.workflows == 0


def test_lead_time_is_the_bounded_median() -> None:
    book = SequenceBook()
    t = T0
    for i, gap in enumerate([10.0, 20.0, 30.0, 40.0, 2000.0, 25.0]):
        book.observe(f"s{i}", "a", t)
        book.observe(f"s{i}", "b", t + gap)
        t += 1
    book.observe("live", "a", t)
    [p] = book.predict(t)
    assert p.repeats == 6
    assert p.lead_s == 25.0  # the half-hour-plus gap counted as a transition, not a lead


@settings(max_examples=50, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.integers(0, 2000), st.sampled_from("abcdefghij"), st.floats(0, 4000)),
        max_size=400,
    )
)
def test_state_stays_within_its_caps(events: list[tuple[int, str, float]]) -> None:
    book = SequenceBook()
    for key, stage, dt in events:
        book.observe(str(key), stage, T0 + dt)
        assert book.workflows <= MAX_WORKFLOWS
        assert len(book.edges()) <= MAX_TRANSITIONS
    for p in book.predict(T0 + 4000):
        assert p.repeats >= MIN_REPEATS and 0 < p.confidence <= 1


def test_transition_cap_drops_the_least_recent_edge() -> None:
    book = SequenceBook()
    t = T0
    for i in range(MAX_TRANSITIONS + 200):  # the first 100 only open cursors
        book.observe(f"k{i % 100}", f"s{i}", t)
        t += 0.01
    assert len(book.edges()) == MAX_TRANSITIONS


def test_state_round_trips() -> None:
    book = SequenceBook()
    t = T0
    for i in range(MIN_REPEATS):
        t = _session(book, f"s{i}", ["a", "b"], t, 10.0)
    book.observe("live", "a", t)
    again = SequenceBook()
    again.from_state(book.to_state())
    assert again.predict(t) == book.predict(t)


def test_stage_of_names_models_and_workloads_and_ignores_the_rest() -> None:
    base = RequestFeatures(at=T0, endpoint="chat", requested_model="m1", affinity_hash="h")
    assert stage_of(base, {"m1"}) == "m1"
    assert stage_of(base, {"m2"}) is None
    auto = RequestFeatures(at=T0, endpoint="chat", requested_model="auto", workload="coding")
    assert stage_of(auto, set()) == "workload:coding"
    retry = RequestFeatures(at=T0, endpoint="chat", requested_model="m1", retry=True)
    assert stage_of(retry, {"m1"}) is None
