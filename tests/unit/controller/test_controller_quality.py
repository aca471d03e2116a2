"""Labelled quality evidence: bounds, confidence, seven-day decay, revision keying, restart."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid_core.controller import Controller
from grid_core.errors import ConflictError, NotFoundError, ValidationError
from grid_core.profile import ModelProfile
from grid_core.reconcile.quality import (
    MAX_QUALITY_ENTRIES,
    QUALITY_FULL_SAMPLES,
    QUALITY_HALF_LIFE_S,
    QualityBook,
)
from grid_core.store import MemoryStore
from grid_core.testing import plugins_with
from grid_server.store import FileStateStore

NOW = 1_800_000_000.0
SHA_A = "a" * 64
SHA_B = "b" * 64
DAY = 86_400.0


def controller(store: object | None = None, sha: str | None = SHA_A) -> Controller:
    ctl = Controller(plugins=plugins_with(), store=store or MemoryStore()).restore()  # type: ignore[arg-type]
    if "m" not in ctl.profiles:
        ctl.put_profile(ModelProfile(model_id="m", memory_mb=1000, artifact_sha256=sha), NOW)
    return ctl


def row(ctl: Controller, workload: str = "coding", now: float = NOW):
    rows = [q for q in ctl.status(now).quality if q.model_id == "m" and q.workload == workload]
    assert len(rows) <= 1
    return rows[0] if rows else None


def test_confidence_reaches_full_weight_after_eight_fresh_evaluations() -> None:
    ctl = controller()
    for i in range(4):
        ctl.record_evaluation("m", "coding", None, 0.5 + 0.1 * (i % 2), NOW)
    q = row(ctl)
    assert q is not None
    assert q.effective_samples == pytest.approx(4.0)
    assert q.confidence == pytest.approx(0.5)
    assert q.score == pytest.approx(0.55)
    assert q.artifact_sha256 == SHA_A  # keyed to the configured revision when omitted
    for _ in range(8):
        ctl.record_evaluation("m", "coding", SHA_A, 0.55, NOW)
    q = row(ctl)
    assert q is not None and q.confidence == 1.0 and q.effective_samples == pytest.approx(12.0)
    assert row(ctl, "research") is None  # workloads are separate evidence


def test_evidence_halves_every_seven_days_and_age_is_reported() -> None:
    ctl = controller()
    for _ in range(8):
        ctl.record_evaluation("m", "coding", None, 0.9, NOW)
    later = NOW + 7 * DAY
    q = row(ctl, now=later)
    assert q is not None
    assert q.effective_samples == pytest.approx(4.0)
    assert q.confidence == pytest.approx(0.5)
    assert q.age_s == pytest.approx(7 * DAY)
    # A fresh evaluation outweighs the faded ones more than it would have a week ago.
    ctl.record_evaluation("m", "coding", None, 0.1, later)
    q = row(ctl, now=later)
    assert q is not None
    assert q.effective_samples == pytest.approx(5.0)
    assert q.score == pytest.approx((0.9 * 4 + 0.1) / 5)
    assert q.age_s == 0.0
    # Long-faded evidence disappears instead of lingering with negligible weight.
    ctl.record_evaluation("m", "research", None, 0.5, later + 80 * DAY)
    assert row(ctl, "coding", now=later + 80 * DAY) is None


@pytest.mark.parametrize("score", [-0.01, 1.01, math.nan, math.inf])
def test_scores_outside_the_unit_interval_are_refused_and_record_nothing(score: float) -> None:
    ctl = controller()
    before = ctl.revisions.dirty
    with pytest.raises(ValidationError, match="score"):
        ctl.record_evaluation("m", "coding", None, score, NOW)
    assert row(ctl) is None and ctl.revisions.dirty == before


@pytest.mark.parametrize("latency", [-1.0, math.nan, 4_000_000.0])
def test_implausible_latency_is_refused(latency: float) -> None:
    ctl = controller()
    with pytest.raises(ValidationError, match="latency_ms"):
        ctl.record_evaluation("m", "coding", None, 0.5, NOW, latency_ms=latency)
    assert row(ctl) is None


def test_latency_is_averaged_when_given() -> None:
    ctl = controller()
    ctl.record_evaluation("m", "coding", None, 0.5, NOW, latency_ms=100.0)
    ctl.record_evaluation("m", "coding", None, 0.5, NOW)  # no latency: only quality moves
    ctl.record_evaluation("m", "coding", None, 0.5, NOW, latency_ms=300.0)
    q = row(ctl)
    assert q is not None and q.latency_ms == pytest.approx(200.0)
    assert q.effective_samples == pytest.approx(3.0)


def test_unknown_model_is_not_found() -> None:
    ctl = controller()
    with pytest.raises(NotFoundError, match="'ghost' has no profile"):
        ctl.record_evaluation("ghost", "coding", None, 0.5, NOW)
    assert ctl.status(NOW).quality == []


def test_a_digest_other_than_the_configured_one_is_a_conflict_naming_the_field() -> None:
    ctl = controller()
    with pytest.raises(ConflictError, match="artifact_sha256"):
        ctl.record_evaluation("m", "coding", SHA_B, 0.9, NOW)
    assert row(ctl) is None
    ctl.record_evaluation("m", "coding", SHA_A.upper(), 0.9, NOW)  # case does not matter
    assert row(ctl) is not None
    unpinned = controller(sha=None)
    with pytest.raises(ConflictError, match="none declared"):
        unpinned.record_evaluation("m", "coding", SHA_A, 0.9, NOW)
    unpinned.record_evaluation("m", "coding", None, 0.9, NOW)
    assert row(unpinned) is not None


def test_a_replacement_artifact_starts_uncertain() -> None:
    ctl = controller()
    for _ in range(8):
        ctl.record_evaluation("m", "coding", None, 0.9, NOW)
    ctl.put_profile(ModelProfile(model_id="m", memory_mb=1000, artifact_sha256=SHA_B), NOW)
    assert row(ctl) is None
    with pytest.raises(ConflictError):  # a late result for the previous revision
        ctl.record_evaluation("m", "coding", SHA_A, 0.9, NOW)
    ctl.record_evaluation("m", "coding", None, 0.2, NOW)
    q = row(ctl)
    assert q is not None and q.artifact_sha256 == SHA_B
    assert q.effective_samples == pytest.approx(1.0) and q.score == pytest.approx(0.2)


def test_retiring_a_model_forgets_its_evidence() -> None:
    ctl = controller()
    ctl.record_evaluation("m", "coding", None, 0.9, NOW)
    ctl.remove_profile("m", NOW)
    assert ctl.quality.entries() == []


def test_evidence_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "state" / "controller.json"
    ctl = controller(FileStateStore(path))
    for _ in range(3):
        ctl.record_evaluation("m", "coding", None, 0.7, NOW, latency_ms=50.0)
    ctl.record_evaluation("m", "research", None, 0.4, NOW)
    before = ctl.status(NOW + DAY).quality
    again = Controller(plugins=plugins_with(), store=FileStateStore(path)).restore()
    after = again.status(NOW + DAY).quality
    assert after == before and len(after) == 2
    # The restored controller keeps accumulating on the same evidence.
    again.record_evaluation("m", "coding", None, 0.7, NOW + DAY)
    q = row(again, now=NOW + DAY)
    assert q is not None
    assert q.effective_samples == pytest.approx(3 * 0.5 ** (1 / 7) + 1, abs=1e-4)


def test_the_book_is_bounded_and_drops_the_stalest() -> None:
    book = QualityBook()
    for i in range(MAX_QUALITY_ENTRIES + 10):
        book.record(
            model_id="m", workload=f"w{i}", sha=None, score=0.5, latency_ms=None, now=NOW + i
        )
    assert len(book) == MAX_QUALITY_ENTRIES
    assert book.get("m", "w0", None) is None
    assert book.get("m", f"w{MAX_QUALITY_ENTRIES + 9}", None) is not None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 30 * DAY)), min_size=1, max_size=20))
def test_score_stays_within_the_inputs_and_confidence_within_the_unit_interval(
    evals: list[tuple[float, float]],
) -> None:
    book = QualityBook()
    t = NOW
    for score, gap in evals:
        t += gap
        book.record(model_id="m", workload="coding", sha=None, score=score, latency_ms=None, now=t)
    profiles = {"m": ModelProfile(model_id="m", memory_mb=1000)}
    views = book.views(profiles, t)
    assert len(views) == 1
    q = views[0]
    scores = [s for s, _ in evals]
    assert min(scores) - 1e-4 <= q.score <= max(scores) + 1e-4  # status rounds to 4 places
    assert 0.0 < q.confidence <= 1.0
    assert q.effective_samples <= len(evals) + 1e-9
    assert q.confidence == pytest.approx(
        min(1.0, q.effective_samples / QUALITY_FULL_SAMPLES), abs=1e-3
    )
    assert QUALITY_HALF_LIFE_S == 7 * DAY
