"""Model co-activation: configured models that repeatedly become active together or in turn.

Source: specification, "Global placement loop" (the model-demand tracker learns mature groups
of models active in the same time buckets and directional pairs active one bucket apart;
current demand for one member can prewarm a quiet peer).

Two kinds of association are learned from a bounded per-minute activity history of configured
models (only configured, non-retiring ids are ever observed, so the open inference endpoint
cannot grow this state):

* **group** ``a ~ b``: the buckets in which both were active over the buckets in which either
  was (the pair usually comes together);
* **pair** ``a → b``: of the completed buckets in which ``a`` was active and whose next bucket
  is also complete, the share in which ``b`` was active in the next one. An incomplete future
  bucket is never counted as a failure.

Both need :data:`MIN_SUPPORT` supporting buckets and :data:`MIN_ASSOCIATION`. Inferred demand for
a quiet target is the association-weighted historical rate ratio times a source's current
direct rate, capped at :data:`PEAK_CAP` times the target's observed peak, and the *maximum* (not
the sum) over at most :data:`MAX_SOURCES` current sources. Only models with direct evidence are
sources, so an inference never propagates (``a → b → c`` does not warm ``c`` from ``a``).

Pure: time is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from grid_core.demand.saved_state import restore_versioned

BUCKET_S = 60.0
"""Co-activation bucket width: one minute, long enough that one person's two related requests
land in one bucket or adjacent ones, short enough that "one bucket apart" is a real order."""
MAX_HISTORY_BUCKETS = 720
"""Activity history kept: twelve hours of minutes (bounded state, a working day's pattern)."""
MIN_SUPPORT = 3
"""Supporting buckets an association needs (specification: at least three)."""
MIN_ASSOCIATION = 0.70
"""Association / transition share an association needs (specification: 0.70)."""
PEAK_CAP = 2.0
"""Inferred demand never exceeds twice the target's observed peak rate (specification)."""
MAX_SOURCES = 32
"""Current sources considered per target (specification: at most 32); the busiest first."""
STATE_VERSION = 1
"""Version of :meth:`CoActivationBook.to_state`; an unknown version is refused."""

Kind = Literal["group", "pair"]


class Association(msgspec.Struct, frozen=True, kw_only=True):
    """One learned association ``source → target`` (see the module text for the kinds)."""

    kind: Kind
    source: str
    target: str
    support: int
    association: float
    rate_ratio: float
    """Target's mean rate over source's mean rate in the supporting buckets."""


class InferredRate(msgspec.Struct, frozen=True, kw_only=True):
    """Inferred demand for one quiet target and the association that produced it.

    Attributes:
        target: model the demand is inferred for.
        source: the current direct source that gave the maximum.
        kind: ``group`` or ``pair``.
        association: the association share (the confidence of this inference).
        support: supporting buckets.
        rate_rps: inferred requests/s (after the peak cap).
        capped: the peak cap bounded the rate.
    """

    target: str
    source: str
    kind: Kind
    association: float
    support: int
    rate_rps: float
    capped: bool = False


class _Bucket(msgspec.Struct, kw_only=True, array_like=True):
    index: int
    counts: dict[str, int]


class _State(msgspec.Struct, kw_only=True):
    version: int
    buckets: list[_Bucket] = []


class CoActivationBook:
    """Bounded per-minute activity of configured models and the associations it supports."""

    def __init__(self) -> None:
        self._buckets: dict[int, dict[str, int]] = {}

    def observe(self, model_id: str, at: float) -> None:
        """Count one direct request for ``model_id`` completed at ``at`` (Unix seconds).

        The caller passes only configured model ids.
        """
        index = math.floor(at / BUCKET_S)
        counts = self._buckets.setdefault(index, {})
        counts[model_id] = counts.get(model_id, 0) + 1
        if len(self._buckets) > MAX_HISTORY_BUCKETS:
            for old in sorted(self._buckets)[: len(self._buckets) - MAX_HISTORY_BUCKETS]:
                del self._buckets[old]

    def forget(self, keep: Iterable[str]) -> None:
        """Drop every model not in ``keep`` (profile removed or retiring)."""
        allowed = set(keep)
        for index in list(self._buckets):
            counts = {m: n for m, n in self._buckets[index].items() if m in allowed}
            if counts:
                self._buckets[index] = counts
            else:
                del self._buckets[index]

    def associations(self, now: float) -> list[Association]:
        """Every association over the completed buckets before ``now`` that is mature.

        Returns:
            Rows sorted by (target, source, kind); both directions of a group are listed.
        """
        current = math.floor(now / BUCKET_S)
        oldest = current - MAX_HISTORY_BUCKETS
        done = {i: c for i, c in self._buckets.items() if oldest <= i < current}
        active: dict[str, set[int]] = {}
        for i, counts in done.items():
            for m, n in counts.items():
                if n > 0:
                    active.setdefault(m, set()).add(i)
        out: list[Association] = []
        models = sorted(active)
        for a in models:
            for b in models:
                if a == b:
                    continue
                both = active[a] & active[b]
                either = active[a] | active[b]
                if len(both) >= MIN_SUPPORT and len(both) / len(either) >= MIN_ASSOCIATION:
                    ratio = _ratio(done, both, both, a, b)
                    out.append(
                        Association(
                            kind="group",
                            source=a,
                            target=b,
                            support=len(both),
                            association=round(len(both) / len(either), 6),
                            rate_ratio=ratio,
                        )
                    )
                trials = {i for i in active[a] if i + 1 < current}
                hits = {i for i in trials if i + 1 in active[b]}
                if (
                    trials
                    and len(hits) >= MIN_SUPPORT
                    and len(hits) / len(trials) >= (MIN_ASSOCIATION)
                ):
                    ratio = _ratio(done, hits, {i + 1 for i in hits}, a, b)
                    out.append(
                        Association(
                            kind="pair",
                            source=a,
                            target=b,
                            support=len(hits),
                            association=round(len(hits) / len(trials), 6),
                            rate_ratio=ratio,
                        )
                    )
        return sorted(out, key=lambda x: (x.target, x.source, x.kind))

    def peak_rps(self, model_id: str) -> float:
        """The target's highest observed bucket rate (requests/s)."""
        peak = max((c.get(model_id, 0) for c in self._buckets.values()), default=0)
        return peak / BUCKET_S

    def infer(self, now: float, direct_rps: Mapping[str, float]) -> list[InferredRate]:
        """Inferred demand for every target that a current direct source is associated with.

        Args:
            now: planning instant (Unix seconds).
            direct_rps: current request rate (requests/s) of every model with *direct*
                evidence now; only these are sources (never an inferred rate: no transitivity).

        Returns:
            One row per target (the maximum over its sources), sorted by target. Targets that
            are themselves direct sources are left out (they have their own evidence).
        """
        sources = sorted(
            ((m, r) for m, r in direct_rps.items() if r > 0), key=lambda x: (-x[1], x[0])
        )[:MAX_SOURCES]
        rate_of = dict(sources)
        best: dict[str, InferredRate] = {}
        for assoc in self.associations(now):
            r = rate_of.get(assoc.source)
            if r is None or assoc.target in direct_rps:
                continue
            raw = assoc.association * assoc.rate_ratio * r
            cap = PEAK_CAP * self.peak_rps(assoc.target)
            rate = min(raw, cap)
            if rate <= 0:
                continue
            row = InferredRate(
                target=assoc.target,
                source=assoc.source,
                kind=assoc.kind,
                association=assoc.association,
                support=assoc.support,
                rate_rps=round(rate, 9),
                capped=raw > cap,
            )
            old = best.get(assoc.target)
            if old is None or (row.rate_rps, row.association) > (old.rate_rps, old.association):
                best[assoc.target] = row
        return [best[k] for k in sorted(best)]

    # --- persistence ------------------------------------------------------------------------
    def to_state(self) -> dict[str, object]:
        """A JSON-compatible snapshot (at most :data:`MAX_HISTORY_BUCKETS` buckets)."""
        state = _State(
            version=STATE_VERSION,
            buckets=[
                _Bucket(index=i, counts=dict(self._buckets[i])) for i in sorted(self._buckets)
            ],
        )
        document: dict[str, object] = msgspec.to_builtins(state)
        return document

    def from_state(self, data: dict[str, object]) -> None:
        """Restore :meth:`to_state` output wholly or not at all.

        Raises:
            StateError: malformed or of an unknown version (nothing changes).
        """
        state = restore_versioned(data, _State, STATE_VERSION, "co-activation", "coactivation")
        self._buckets = {b.index: dict(b.counts) for b in state.buckets[-MAX_HISTORY_BUCKETS:]}


def _ratio(
    done: Mapping[int, Mapping[str, int]], src: set[int], dst: set[int], a: str, b: str
) -> float:
    """Mean rate of ``b`` over ``dst`` buckets divided by mean rate of ``a`` over ``src``."""
    na = sum(done[i].get(a, 0) for i in src) / len(src)
    nb = sum(done[i].get(b, 0) for i in dst) / len(dst)
    return round(nb / na, 6) if na > 0 else 0.0
