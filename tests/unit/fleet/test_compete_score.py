"""``grid test compete``'s pure parts: the checker, the scores, the ranking, the candidate
rules, the temporary edits and the report (no fleet, no process)."""

from __future__ import annotations

import pytest
from grid_fleet import compete_score as cs
from hypothesis import given
from hypothesis import strategies as st

from grid_core.errors import ValidationError


@pytest.mark.parametrize(
    ("text", "expected", "ok"),
    [
        ("5", "5", True),
        ("  `cba`.\nbecause slicing reverses", "cba", True),
        ("\n\n'False'", "false", True),
        ("distinct", "DISTINCT", True),
        ("The answer is 5", "5", False),
        ("55", "5", False),
        ("", "5", False),
        ("\ufffd\ufffdg5", "5", False),
    ],
)
def test_the_checker_is_an_exact_match_of_the_first_line(text, expected, ok):
    assert cs.is_correct(text, expected) is ok


def test_every_question_has_a_coding_keyword_and_the_set_gives_full_confidence():
    """Eight questions: quality confidence is full at eight fresh evaluations; each prompt
    names a language, so the classifier files the same prompt as coding."""
    assert len(cs.QUESTIONS) == 8
    for q in cs.QUESTIONS:
        words = q.prompt.lower()
        assert any(k in words for k in ("python", "sql", "javascript", "code"))
        assert cs.is_correct(q.expected, q.expected)


@given(
    st.booleans(),
    st.floats(1.0, 60_000.0),
    st.floats(1.0, 60_000.0),
    st.floats(1.0, 60_000.0),
)
def test_a_correct_answer_always_outweighs_any_speed(correct, slow_ms, fast_ms, best_ms):
    """Scores stay in [0, 1], a correct answer beats any wrong one, and among equally
    correct answers the faster one never scores lower."""
    right = cs.answer_score(True, slow_ms, best_ms)
    wrong = cs.answer_score(False, fast_ms, best_ms)
    assert 0.0 <= wrong < right <= 1.0
    a = cs.answer_score(correct, min(slow_ms, fast_ms), best_ms)
    b = cs.answer_score(correct, max(slow_ms, fast_ms), best_ms)
    assert a >= b


def _result(model: str, latencies: list[float], correct: int = 0) -> cs.Result:
    r = cs.Result(model, "a" * 64)
    r.answers = [cs.Answer(i, ms, i < correct, "x") for i, ms in enumerate(latencies)]
    return r


def test_with_correctness_tied_the_faster_candidate_wins_by_latency():
    fast = _result("tiny.gguf", [30, 32, 28, 35, 31, 29, 33, 30])
    slow = _result("big.gguf", [300, 310, 290, 305, 320, 299, 301, 315])
    cs.score_all([slow, fast])
    winner, runner_up = cs.ranked([slow, fast])
    assert (winner.model_id, runner_up.model_id) == ("tiny.gguf", "big.gguf")
    # Fastest p50 = 30 ms: the fast model's answers score near 0.2, the slow one's near 0.02.
    assert winner.score == pytest.approx(0.2, abs=0.02)
    assert runner_up.score == pytest.approx(0.02, abs=0.01)
    why = cs.why(winner, runner_up)
    assert "0/8 correct vs 0/8" in why and "latency decided" in why
    assert "p50 30 ms vs 301 ms" in why


@pytest.mark.parametrize(("correct", "slow_ms"), [(2, 100_000.0), (1, 59.0)])
def test_correctness_beats_speed(correct, slow_ms):
    """Two more correct answers in eight beat any speed; one more beats being up to twice
    as slow."""
    slow_right = _result("big.gguf", [slow_ms] * 8, correct=correct)
    fast_wrong = _result("tiny.gguf", [30] * 8)
    cs.score_all([slow_right, fast_wrong])
    winner, _ = cs.ranked([fast_wrong, slow_right])
    assert winner.model_id == "big.gguf"
    assert "correctness decided" in cs.why(winner, fast_wrong)


def _profile(model: str, coding: float | None, **kw: object) -> dict[str, object]:
    doc: dict[str, object] = {"model_id": model, "memory_mb": 100, **kw}
    if coding is not None:
        doc["workload_scores"] = {"coding": coding, "research": 0.5}
    return doc


def test_candidates_are_the_optional_profiles_with_a_coding_score():
    profiles = [
        _profile("b.gguf", 0.8, artifact_sha256="b" * 64),
        _profile("base.gguf", None, min_replicas=1),
        _profile("a.gguf", 0.9),
    ]
    assert cs.candidates_of(profiles) == [("a.gguf", None), ("b.gguf", "b" * 64)]


def test_too_few_candidates_name_the_fix():
    with pytest.raises(ValidationError, match="at least 2 coding candidates, found 1") as exc:
        cs.candidates_of([_profile("a.gguf", 0.9), _profile("b.gguf", None)])
    assert "--workload-score coding=" in str(exc.value)
    # The command to copy reaches the fleet server (without --grid it asks a local 'grid up').
    assert "--grid test-fleet" in str(exc.value)


def test_too_many_candidates_are_refused():
    with pytest.raises(ValidationError, match="at most 4"):
        cs.candidates_of([_profile(f"m{i}.gguf", 0.5) for i in range(5)])


@pytest.mark.parametrize(
    ("field", "named", "fix"),
    [
        ({"min_replicas": 1}, "has min_replicas 1,", "--min-replicas 0"),
        ({"pins": ["host-01"]}, "has pins host-01,", "--clear-pins"),
    ],
)
def test_a_candidate_that_cannot_be_offloaded_is_refused(field, named, fix):
    """The message names the field that holds the candidate and the command that frees it."""
    with pytest.raises(ValidationError, match="can never be offloaded") as exc:
        cs.candidates_of([_profile("a.gguf", 0.9, **field), _profile("b.gguf", 0.8)])
    assert named in str(exc.value)
    assert f"grid allocator model set a.gguf --grid test-fleet {fix}" in str(exc.value)


def test_the_temporary_edits_change_only_what_they_name():
    original = _profile("a.gguf", 0.9, required_tags=["gpu"], max_replicas=2)
    loaded = cs.with_min_replica(original)
    assert loaded == {**original, "min_replicas": 1}
    constrained = cs.with_constraint(original)
    assert constrained == {**original, "required_tags": ["gpu", cs.CONSTRAINT_TAG]}
    assert cs.with_constraint(constrained) == constrained  # never doubled
    assert original["required_tags"] == ["gpu"]  # the original is not mutated


def test_the_report_renders_candidates_steps_and_the_winner():
    fast = _result("tiny.gguf", [30] * 8)
    slow = _result("big.gguf", [300] * 8)
    cs.score_all([fast, slow])
    fast.evaluations = slow.evaluations = 8
    report = {
        "candidates": [cs.result_doc(r) for r in cs.ranked([fast, slow])],
        "steps": [{"step": "serve", "seconds": 4.25, "detail": "tiny.gguf answered"}],
        "winner": "tiny.gguf",
        "runner_up": "big.gguf",
        "why": cs.why(fast, slow),
    }
    text = cs.render_report(report)
    assert text.index("tiny.gguf") < text.index("big.gguf")
    assert "0/8" in text and "4.2" in text
    assert "winner: tiny.gguf" in text and "runner-up: big.gguf" in text


def test_a_small_lead_is_reported_as_not_decisive():
    fast = _result("tiny.gguf", [30] * 8)
    near = _result("near.gguf", [33] * 8)
    slow = _result("big.gguf", [300] * 8)
    cs.score_all([fast, near, slow])
    assert cs.margin_note(fast, slow) is None  # 0.18 ahead
    note = cs.margin_note(fast, near)
    assert note is not None and "may still prefer the runner-up" in note
    assert cs.margin(fast, near) < cs.DECISIVE_MARGIN
