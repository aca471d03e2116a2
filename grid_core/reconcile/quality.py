"""Labelled quality evidence: operator evaluations of a model on a workload.

Each evaluation (a score in [0, 1], optionally a latency) is folded into a decaying weighted
mean keyed by (model, workload, artifact SHA-256). Its effective sample count halves every
seven days, confidence reaches full weight at eight fresh evaluations, and a replacement
artifact starts uncertain because its key differs. Specification, "Proactive observation and
portfolio planning" (measured outcomes and separately labelled quality).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import msgspec

from grid_core.errors import ConflictError, NotFoundError, ValidationError
from grid_core.profile import ModelProfile

QUALITY_FULL_SAMPLES = 8.0
"""Fresh evaluations at which quality confidence reaches full weight: a handful of labelled
runs is enough to trust a score, one is not."""
QUALITY_HALF_LIFE_S = 7 * 86_400.0
"""Seven days: a week-old evaluation counts half, so stale quality fades instead of lingering."""
QUALITY_FORGET_WEIGHT = 0.01
"""Effective samples below which an entry carries no information and is dropped (about seven
half-lives after a single evaluation)."""
MAX_QUALITY_ENTRIES = 1024
"""Bound on durable entries: 64 models x 16 workloads; the stalest go first."""
MAX_LATENCY_MS = 3_600_000.0
"""An evaluation latency above one hour is implausible and refused."""


class QualityEvidence(msgspec.Struct, kw_only=True):
    """Decaying quality evidence for one (model, workload, artifact revision) (durable).

    Attributes:
        model_id / workload: what was evaluated, for which workload.
        artifact_sha256: artifact revision evaluated (``None`` when the profile pins none).
        score: weighted mean score in [0, 1].
        weight: effective sample count as of ``updated_at`` (decays from there).
        latency_ms: weighted mean evaluation latency (ms), when any was reported.
        latency_weight: effective latency sample count as of ``updated_at``.
        updated_at: wall-clock seconds of the last evaluation.
    """

    model_id: str
    workload: str
    artifact_sha256: str | None = None
    score: float
    weight: float
    latency_ms: float | None = None
    latency_weight: float = 0.0
    updated_at: float

    def plausible(self) -> bool:
        """Whether a restored row is usable."""
        nums = (self.score, self.weight, self.latency_weight, self.updated_at)
        return (
            all(math.isfinite(v) for v in nums)
            and 0.0 <= self.score <= 1.0
            and self.weight > 0.0
            and self.latency_weight >= 0.0
            and (self.latency_ms is None or 0.0 <= self.latency_ms <= MAX_LATENCY_MS)
        )


def decay(weight: float, since: float, now: float) -> float:
    """``weight`` decayed from ``since`` to ``now`` (a clock moving backward decays nothing)."""
    return weight * math.pow(0.5, max(0.0, now - since) / QUALITY_HALF_LIFE_S)


class QualityView(msgspec.Struct, frozen=True, kw_only=True):
    """One model/workload's current-revision quality evidence as status shows it.

    Attributes:
        score: weighted mean score in [0, 1].
        effective_samples: decayed evaluation count at the status time.
        confidence: ``effective_samples / 8`` capped at 1.
        age_s: seconds since the last evaluation.
        latency_ms: weighted mean evaluation latency, if any was reported.
    """

    model_id: str
    workload: str
    artifact_sha256: str | None
    score: float
    effective_samples: float
    confidence: float
    age_s: float
    latency_ms: float | None = None


class QualityBook:
    """Bounded quality evidence keyed by (model, workload, artifact SHA-256)."""

    def __init__(self, entries: Iterable[QualityEvidence] = ()) -> None:
        self._by_key: dict[tuple[str, str, str], QualityEvidence] = {}
        for e in entries:
            if e.plausible():
                self._by_key[(e.model_id, e.workload, e.artifact_sha256 or "")] = e

    def __len__(self) -> int:
        return len(self._by_key)

    def entries(self) -> list[QualityEvidence]:
        """Every entry in key order (the durable form)."""
        return [self._by_key[k] for k in sorted(self._by_key)]

    def get(self, model_id: str, workload: str, sha: str | None) -> QualityEvidence | None:
        """The entry for one key, if any."""
        return self._by_key.get((model_id, workload, sha or ""))

    def record(
        self,
        *,
        model_id: str,
        workload: str,
        sha: str | None,
        score: float,
        latency_ms: float | None,
        now: float,
    ) -> QualityEvidence:
        """Fold one evaluation in (inputs already validated) and return the entry."""
        key = (model_id, workload, sha or "")
        cur = self._by_key.get(key)
        if cur is None:
            cur = QualityEvidence(
                model_id=model_id,
                workload=workload,
                artifact_sha256=sha,
                score=score,
                weight=1.0,
                updated_at=now,
            )
            if latency_ms is not None:
                cur.latency_ms, cur.latency_weight = latency_ms, 1.0
        else:
            w = decay(cur.weight, cur.updated_at, now)
            cur.score = (cur.score * w + score) / (w + 1.0)
            cur.weight = w + 1.0
            lw = decay(cur.latency_weight, cur.updated_at, now)
            if latency_ms is not None:
                prior = cur.latency_ms if cur.latency_ms is not None else latency_ms
                cur.latency_ms = (prior * lw + latency_ms) / (lw + 1.0)
                lw += 1.0
            cur.latency_weight = lw
            cur.updated_at = max(cur.updated_at, now)
        self._by_key[key] = cur
        self.prune(now)
        return cur

    def prune(self, now: float, profiles: Mapping[str, ModelProfile] | None = None) -> None:
        """Drop faded entries, entries of other revisions (when ``profiles`` is given) and the
        stalest beyond :data:`MAX_QUALITY_ENTRIES`."""
        for k, e in list(self._by_key.items()):
            faded = decay(e.weight, e.updated_at, now) < QUALITY_FORGET_WEIGHT
            stale = profiles is not None and (
                e.model_id not in profiles or (profiles[e.model_id].artifact_sha256 or "") != k[2]
            )
            if faded or stale:
                del self._by_key[k]
        if len(self._by_key) > MAX_QUALITY_ENTRIES:
            order = sorted(self._by_key, key=lambda k: (self._by_key[k].updated_at, k))
            for k in order[: len(self._by_key) - MAX_QUALITY_ENTRIES]:
                del self._by_key[k]

    def views(self, profiles: Mapping[str, ModelProfile], now: float) -> list[QualityView]:
        """Status rows for every configured model's current artifact revision."""
        out = []
        for (mid, workload, sha), e in sorted(self._by_key.items()):
            p = profiles.get(mid)
            if p is None or (p.artifact_sha256 or "") != sha:
                continue
            n = decay(e.weight, e.updated_at, now)
            out.append(
                QualityView(
                    model_id=mid,
                    workload=workload,
                    artifact_sha256=e.artifact_sha256,
                    score=round(e.score, 4),
                    effective_samples=round(n, 4),
                    confidence=round(min(1.0, n / QUALITY_FULL_SAMPLES), 4),
                    age_s=round(max(0.0, now - e.updated_at), 3),
                    latency_ms=None if e.latency_ms is None else round(e.latency_ms, 3),
                )
            )
        return out


def check_evaluation(
    profile: ModelProfile | None,
    model_id: str,
    workload: str,
    artifact_sha256: str | None,
    score: object,
    latency_ms: float | None,
) -> str | None:
    """Validate one operator evaluation before anything is recorded.

    Args:
        profile: the configured profile of ``model_id`` (``None`` when there is none).
        model_id: the evaluated model.
        workload: the workload the evaluation measured (non-empty).
        artifact_sha256: the evaluated revision; ``None`` means the configured one.
        score: quality in [0, 1] (checked here: anything else is refused).
        latency_ms: optional latency in milliseconds (0 .. one hour).

    Returns:
        The configured artifact SHA-256 the evidence is keyed by (``None`` when undeclared).

    Raises:
        NotFoundError: no profile has ``model_id``.
        ConflictError: ``artifact_sha256`` differs from the profile's artifact_sha256.
        ValidationError: an empty workload, a score outside [0, 1] or a bad latency.
    """
    if profile is None:
        msg = f"evaluation: model '{model_id}' has no profile; set one first"
        raise NotFoundError(msg)
    configured = profile.artifact_sha256
    if artifact_sha256 is not None and artifact_sha256.lower() != configured:
        msg = (
            f"evaluation: artifact_sha256 {artifact_sha256[:12]}… does not match the "
            f"configured artifact_sha256 of '{model_id}' "
            f"({configured[:12] + '…' if configured else 'none declared'}); evaluate "
            "the configured artifact or update the profile first"
        )
        raise ConflictError(msg)
    if not workload:
        raise ValidationError("evaluation: 'workload' must be a non-empty name")
    if not (isinstance(score, int | float) and math.isfinite(score) and 0 <= score <= 1):
        raise ValidationError(f"evaluation: 'score' {score!r} must be a number in [0, 1]")
    if latency_ms is not None and not (
        math.isfinite(latency_ms) and 0.0 <= latency_ms <= MAX_LATENCY_MS
    ):
        msg = f"evaluation: 'latency_ms' must be in [0, {MAX_LATENCY_MS:.0f}] ms"
        raise ValidationError(msg)
    return configured
