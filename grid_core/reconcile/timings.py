"""Learned lifecycle timings: how long warm, verify-only load and fetching load really take.

Managed nodes report ``duration_seconds`` (and ``artifact_fetched`` for loads) in their
acknowledgements. The controller folds each plausible successful report into a bounded
eight-sample EWMA keyed by (host, model, artifact SHA-256, phase), blends it with the
profile's prior until four samples make it authoritative, and hands the result to the planner
and demand tracker through :attr:`grid_core.snapshot.HostSnapshot.performance`.

Specification, "Global placement loop" (learned warm/load/fetch timings, artifact-revision
keying, 30-day expiry, invalid reports ignored) and "Local wire contract"
(``artifact_fetched``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ModelPerformance

Phase = Literal["warm", "load", "fetch"]
"""``warm``: process start to ready; ``load``: a load that only verified cached weights;
``fetch``: a load that ran the artifact fetch path (network transfer plus verification)."""

TIMING_WINDOW = 8
"""EWMA length: the mean of the first eight samples, then weight 1/8 per new sample, so one
slow outlier moves the estimate by an eighth instead of replacing it."""
TIMING_AUTHORITY_SAMPLES = 4
"""Samples after which the learned value fully replaces the profile prior; before that the
two are blended linearly so a single lucky report cannot promise an instant start."""
TIMING_EXPIRY_S = 30 * 86_400.0
"""Thirty days: a runtime, storage or network upgrade gets relearned instead of trusted."""
MAX_REPORTED_S = 3600.0
"""Reports above one hour are implausible (clock trouble, a stuck node) and are ignored."""
MAX_TIMING_ENTRIES = 4096
"""Bound on durable entries: 64 hosts x 20 models x 3 phases fits; the stalest go first."""


WARM_DEADLINE_FACTOR = 3.0
"""A warm may take this many times its expected duration before it counts as hung: page-cache
misses, a busy disk or a loaded CPU slow a start by a small factor, a hung one never ends."""
WARM_DEADLINE_FLOOR_S = 180.0
"""Shortest warm deadline (seconds): what every start got before deadlines were derived, so a
model whose estimate is a few seconds still survives a cold disk on a loaded host."""
WARM_DEADLINE_MAX_S = MAX_REPORTED_S
"""Longest warm deadline (seconds): a start beyond an hour is hung, and a report that long
is already ignored as implausible."""

DeadlineBasis = Literal["floor", "profile", "learned"]
"""What set a warm deadline: the floor, the profile's ``warm_estimate_s`` (nothing learned
for that host and revision yet) or the learned warm time."""


def warm_deadline_s(
    profile: ModelProfile, learned_warm_s: float | None
) -> tuple[float, DeadlineBasis]:
    """How long a warm of ``profile`` may take before the node stops it as failed.

    The expected duration is the learned warm time for the host and artifact revision (the
    blend :func:`blend` hands the planner, authoritative after four samples) or else the
    profile's ``warm_estimate_s``; the deadline is :data:`WARM_DEADLINE_FACTOR` times it,
    within [:data:`WARM_DEADLINE_FLOOR_S`, :data:`WARM_DEADLINE_MAX_S`]. Source: the
    specification's "Global placement loop" (learned warm timings replace the configured
    prior; an unknown host keeps the conservative configured fallback) and issue 20.

    Args:
        profile: the model's profile.
        learned_warm_s: learned warm seconds on the target host (``None``: nothing learned).

    Returns:
        (deadline in seconds, what set it).
    """
    learned = learned_warm_s is not None and math.isfinite(learned_warm_s)
    expected = learned_warm_s if learned else profile.warm_estimate_s
    assert expected is not None
    want = WARM_DEADLINE_FACTOR * max(0.0, expected)
    if want <= WARM_DEADLINE_FLOOR_S:
        return WARM_DEADLINE_FLOOR_S, "floor"
    return min(WARM_DEADLINE_MAX_S, want), "learned" if learned else "profile"


class LearnedTiming(msgspec.Struct, kw_only=True):
    """One learned duration (durable).

    Attributes:
        host_id / model_id: where and what.
        artifact_sha256: artifact revision the samples measured (``None`` when unpinned).
        phase: ``warm``, ``load`` (verify-only) or ``fetch``.
        mean_s: EWMA duration in seconds.
        samples: accepted reports, capped at :data:`TIMING_WINDOW`.
        updated_at: wall-clock seconds of the last accepted report.
    """

    host_id: str
    model_id: str
    artifact_sha256: str | None = None
    phase: Phase
    mean_s: float
    samples: int
    updated_at: float

    def plausible(self) -> bool:
        """Whether a restored row is usable (finite, in range, at least one sample)."""
        return (
            math.isfinite(self.mean_s)
            and 0.0 <= self.mean_s <= MAX_REPORTED_S
            and 1 <= self.samples <= TIMING_WINDOW
            and math.isfinite(self.updated_at)
        )


def phase_of(kind: str, artifact_fetched: bool) -> Phase | None:
    """The learned phase an action receipt measures, or ``None`` when it measures none."""
    if kind == "warm":
        return "warm"
    if kind == "load":
        return "fetch" if artifact_fetched else "load"
    return None


def valid_duration(seconds: float | None) -> bool:
    """A usable report: present, finite, non-negative and at most one hour."""
    return seconds is not None and math.isfinite(seconds) and 0.0 <= seconds <= MAX_REPORTED_S


def blend(entry: LearnedTiming | None, prior: float, now: float) -> float | None:
    """The duration to plan with: ``None`` when nothing fresh is learned (use the prior).

    Before :data:`TIMING_AUTHORITY_SAMPLES` the learned mean is weighted by
    ``samples / TIMING_AUTHORITY_SAMPLES`` against ``prior`` (seconds).
    """
    if entry is None or now - entry.updated_at > TIMING_EXPIRY_S:
        return None
    w = min(1.0, entry.samples / TIMING_AUTHORITY_SAMPLES)
    return w * entry.mean_s + (1.0 - w) * prior


class TimingBook:
    """Learned timings keyed by (host, model, artifact SHA-256, phase)."""

    def __init__(self, entries: Iterable[LearnedTiming] = ()) -> None:
        self._by_key: dict[tuple[str, str, str, str], LearnedTiming] = {}
        for e in entries:
            if e.plausible():
                self._by_key[self._key(e.host_id, e.model_id, e.artifact_sha256, e.phase)] = e

    @staticmethod
    def _key(host_id: str, model_id: str, sha: str | None, phase: str) -> tuple[str, str, str, str]:
        return (host_id, model_id, sha or "", phase)

    def __len__(self) -> int:
        return len(self._by_key)

    def entries(self) -> list[LearnedTiming]:
        """Every entry in key order (the durable form)."""
        return [self._by_key[k] for k in sorted(self._by_key)]

    def get(
        self, host_id: str, model_id: str, sha: str | None, phase: Phase
    ) -> LearnedTiming | None:
        """The entry for one key, if any (expired ones included; see :func:`blend`)."""
        return self._by_key.get(self._key(host_id, model_id, sha, phase))

    def observe(
        self,
        *,
        host_id: str,
        model_id: str,
        sha: str | None,
        kind: str,
        artifact_fetched: bool,
        duration_s: float | None,
        now: float,
    ) -> bool:
        """Fold one successful action receipt in; returns whether it was accepted.

        Args:
            host_id / model_id: where the action ran and for which model.
            sha: artifact SHA-256 the action concerned (``None`` when unpinned).
            kind: action kind; only ``load`` and ``warm`` are learned.
            artifact_fetched: the load ran the fetch path (selects ``fetch`` vs ``load``).
            duration_s: reported seconds; invalid values are ignored, never clamped.
            now: receipt time (wall-clock seconds).
        """
        phase = phase_of(kind, artifact_fetched)
        if phase is None or not valid_duration(duration_s) or not math.isfinite(now):
            return False
        assert duration_s is not None
        key = self._key(host_id, model_id, sha, phase)
        cur = self._by_key.get(key)
        if cur is None or now - cur.updated_at > TIMING_EXPIRY_S:
            cur = LearnedTiming(
                host_id=host_id,
                model_id=model_id,
                artifact_sha256=sha,
                phase=phase,
                mean_s=duration_s,
                samples=1,
                updated_at=now,
            )
        else:
            n = min(TIMING_WINDOW, cur.samples + 1)
            cur.mean_s += (duration_s - cur.mean_s) / n
            cur.samples = n
            cur.updated_at = max(cur.updated_at, now)
        self._by_key[key] = cur
        self.prune(now)
        return True

    def prune(self, now: float) -> None:
        """Drop expired entries, then the stalest beyond :data:`MAX_TIMING_ENTRIES`."""
        for k in [k for k, e in self._by_key.items() if now - e.updated_at > TIMING_EXPIRY_S]:
            del self._by_key[k]
        if len(self._by_key) > MAX_TIMING_ENTRIES:
            order = sorted(self._by_key, key=lambda k: (self._by_key[k].updated_at, k))
            for k in order[: len(self._by_key) - MAX_TIMING_ENTRIES]:
                del self._by_key[k]

    def performance(
        self, host_id: str, profile: ModelProfile, now: float
    ) -> tuple[float | None, float | None, float | None]:
        """(warm_s, load_s, fetch_s) to plan with for ``profile`` on ``host_id``.

        Only samples of the profile's current artifact revision count, so a checksum change
        starts from the priors. ``None`` means nothing fresh is learned for that phase.
        """
        sha = profile.artifact_sha256
        return (
            blend(self.get(host_id, profile.model_id, sha, "warm"), profile.warm_estimate_s, now),
            blend(self.get(host_id, profile.model_id, sha, "load"), profile.load_estimate_s, now),
            blend(self.get(host_id, profile.model_id, sha, "fetch"), profile.load_estimate_s, now),
        )

    def apply(
        self, hosts: Iterable[HostSnapshot], profiles: Mapping[str, ModelProfile], now: float
    ) -> list[HostSnapshot]:
        """Hosts with learned timings written into ``performance`` (others unchanged).

        Server-measured latency and throughput already in the snapshot are kept; only the
        lifecycle fields are set. A host with nothing learned keeps the profile fallback.
        """
        learned_hosts = {k[0] for k in self._by_key}
        out = []
        for h in hosts:
            if h.host_id not in learned_hosts:
                out.append(h)
                continue
            perf = dict(h.performance)
            changed = False
            for mid, profile in profiles.items():
                warm, load, fetch = self.performance(h.host_id, profile, now)
                if warm is None and load is None and fetch is None:
                    continue
                cur = perf.get(mid) or ModelPerformance()
                perf[mid] = msgspec.structs.replace(cur, warm_s=warm, load_s=load, fetch_s=fetch)
                changed = True
            out.append(msgspec.structs.replace(h, performance=perf) if changed else h)
        return out


class TimingView(msgspec.Struct, frozen=True, kw_only=True):
    """One learned timing as status shows it (seconds)."""

    host_id: str
    model_id: str
    artifact_sha256: str | None
    phase: Phase
    mean_s: float
    samples: int
    authoritative: bool
    age_s: float

    @classmethod
    def of(cls, e: LearnedTiming, now: float) -> TimingView:
        """The view of one entry at ``now``."""
        return cls(
            host_id=e.host_id,
            model_id=e.model_id,
            artifact_sha256=e.artifact_sha256,
            phase=e.phase,
            mean_s=round(e.mean_s, 3),
            samples=e.samples,
            authoritative=e.samples >= TIMING_AUTHORITY_SAMPLES,
            age_s=round(max(0.0, now - e.updated_at), 3),
        )
