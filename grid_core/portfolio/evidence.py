"""Outcome evidence: how a model actually served a workload's unbound requests.

Specification, "Proactive observation and portfolio planning": measured model/workload
outcomes are keyed by (model, workload, artifact SHA-256) — a replacement artifact starts
uncertain and a late response for an older revision cannot update the new one — reach full
confidence after twenty fresh requests, and decay with a seven-day half-life independent of
labelled quality (:mod:`grid_core.reconcile.quality`). A bounded optimism bonus lets an
equally suitable, feasible cold candidate earn a canary and falls to zero as evidence grows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import msgspec

from grid_core.demand.features import RequestFeatures
from grid_core.profile import ModelProfile

MEASURED_OUTCOMES = frozenset({"ok", "error", "rejected"})
"""Outcomes an engine produced (Grid's own 503 and caller errors say nothing of a model)."""

OUTCOME_FULL_SAMPLES = 20.0
"""Fresh completions at which outcome confidence reaches full weight (specification)."""
OUTCOME_HALF_LIFE_S = 7 * 86_400.0
"""Seven days: outcome evidence halves weekly, independently of labelled quality."""
OPTIMISM_BONUS = 6.0
"""Points of the exploration bonus for a candidate without evidence (specification: a
six-point bonus, smaller than meaningful suitability differences of 10+ points)."""
MAX_OUTCOME_ENTRIES = 1024
"""Bound on durable entries (64 models x 16 workloads); the stalest go first."""
FORGET_WEIGHT = 0.01
"""Effective samples below which an entry carries no information and is dropped."""


class OutcomeEvidence(msgspec.Struct, kw_only=True):
    """Decaying outcome evidence for one (model, workload, artifact revision) (durable).

    Attributes:
        model_id / workload / artifact_sha256: the key (``None`` when no digest is pinned).
        success: weighted mean of successful completions (0..1).
        service_s: weighted mean measured service time of successful completions (s).
        weight: effective sample count as of ``updated_at``.
        updated_at: wall-clock seconds of the last completion.
    """

    model_id: str
    workload: str
    artifact_sha256: str | None = None
    success: float
    service_s: float | None = None
    weight: float
    updated_at: float

    def plausible(self) -> bool:
        """Whether a restored row is usable."""
        nums = (self.success, self.weight, self.updated_at)
        return (
            all(math.isfinite(v) for v in nums)
            and 0.0 <= self.success <= 1.0
            and self.weight > 0.0
            and (self.service_s is None or (math.isfinite(self.service_s) and self.service_s >= 0))
        )


def decayed(weight: float, since: float, now: float) -> float:
    """``weight`` decayed from ``since`` to ``now`` (a clock moving backward decays nothing)."""
    return weight * math.pow(0.5, max(0.0, now - since) / OUTCOME_HALF_LIFE_S)


class OutcomeBook:
    """Bounded outcome evidence keyed by (model, workload, artifact SHA-256)."""

    def __init__(self, entries: Iterable[OutcomeEvidence] = ()) -> None:
        self._by_key: dict[tuple[str, str, str], OutcomeEvidence] = {}
        for e in entries:
            if e.plausible():
                self._by_key[(e.model_id, e.workload, e.artifact_sha256 or "")] = e

    def __len__(self) -> int:
        return len(self._by_key)

    def entries(self) -> list[OutcomeEvidence]:
        """Every entry in key order (the durable form)."""
        return [self._by_key[k] for k in sorted(self._by_key)]

    def observe(self, features: RequestFeatures, profiles: Mapping[str, ModelProfile]) -> None:
        """Fold an unbound request's completion into the evidence of the model that served
        it, under that model's current artifact revision (no workload or no engine: nothing)."""
        served = features.served_model
        profile = profiles.get(served) if served is not None else None
        if profile is None or not features.workload or features.outcome not in MEASURED_OUTCOMES:
            return
        self.record(
            model_id=profile.model_id,
            workload=features.workload,
            sha=profile.artifact_sha256,
            ok=features.outcome == "ok",
            service_s=features.service_time_s,
            now=features.at,
        )

    def record(
        self,
        *,
        model_id: str,
        workload: str,
        sha: str | None,
        ok: bool,
        service_s: float | None,
        now: float,
    ) -> None:
        """Fold one measured completion of an unbound request served by ``model_id``."""
        key = (model_id, workload, sha or "")
        e = self._by_key.get(key)
        if e is None:
            e = OutcomeEvidence(
                model_id=model_id,
                workload=workload,
                artifact_sha256=sha,
                success=0.0,
                weight=0.0,
                updated_at=now,
            )
            self._by_key[key] = e
        w = decayed(e.weight, e.updated_at, now)
        e.success = (e.success * w + (1.0 if ok else 0.0)) / (w + 1.0)
        if ok and service_s is not None and math.isfinite(service_s) and service_s >= 0:
            prev = e.service_s if e.service_s is not None else service_s
            e.service_s = (prev * w + service_s) / (w + 1.0)
        e.weight = w + 1.0
        e.updated_at = max(e.updated_at, now)
        if len(self._by_key) > MAX_OUTCOME_ENTRIES:
            stalest = min(self._by_key, key=lambda k: self._by_key[k].updated_at)
            del self._by_key[stalest]

    def view(
        self, model_id: str, workload: str, sha: str | None, now: float
    ) -> tuple[float, float]:
        """(success in [0, 1], confidence in [0, 1]) of the current revision's evidence."""
        e = self._by_key.get((model_id, workload, sha or ""))
        if e is None:
            return 1.0, 0.0
        w = decayed(e.weight, e.updated_at, now)
        if w < FORGET_WEIGHT:
            return 1.0, 0.0
        return e.success, min(1.0, w / OUTCOME_FULL_SAMPLES)

    def validated(self, model_id: str, workload: str, sha: str | None, now: float) -> bool:
        """A fresh successful response from exactly this model/workload/revision exists."""
        success, confidence = self.view(model_id, workload, sha, now)
        return confidence > 0.0 and success > 0.0


def optimism_bonus(confidence: float) -> float:
    """The remaining exploration bonus (points): six without evidence, zero at full weight."""
    return OPTIMISM_BONUS * max(0.0, 1.0 - confidence)
