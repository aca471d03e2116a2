"""The prefetch scorecard: did prediction start the right models early, or only fill disks?

Source: the specification's scenario lab (the scorecard reports prefetch downloads, hits,
unused predictions, expiration and reclaimed disk, lead time and avoided load seconds, so a
predictor that merely fills disk cannot look successful).

A *predictive start* is a warm the control ordered for a model whose demand that tick was
inferred only (a learned workflow or co-activation, never direct, baseline or workload
projection). It is a *hit* when the model then served a request while that replica was up, and
*unused* when the replica went away (or the run ended) without one. Lead time is the time from
the start to the model's first served request; avoided load seconds are the cold-start seconds
(the profile's load estimate when the start had to download, plus its warm estimate) that the
first request did not wait for. Expiries count predictive cache entries removed by the TTL or a
replacement and the disk they gave back.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from grid_core.demand.prefetch import PREDICTIVE_FETCH
from grid_core.profile import ModelProfile
from grid_core.scenario.config import TICK_S
from grid_core.scenario.fleet import Order

PREDICTIVE_REASONS = frozenset({"sequence", "group", "pair"})
"""Demand reasons that mark inferred-only demand from the prediction plugins."""
PREDICTIVE_EVICTIONS = frozenset({"predictive_ttl", "predictive_replace"})
"""Eviction reasons of the predictive cache lifecycle."""


@dataclass
class _Start:
    tick: int
    downloaded: bool
    first_use_tick: int | None = None


@dataclass
class PrefetchScorecard:
    """Counters of one run (see the module text for what each means)."""

    profiles: dict[str, ModelProfile]
    downloads: int = 0
    starts: int = 0
    hits: int = 0
    unused: int = 0
    expiries: int = 0
    reclaimed_mb: int = 0
    avoided_load_s: float = 0.0
    cache_only: int = 0
    cache_hits: int = 0
    leads_s: list[float] = field(default_factory=list)
    _open: dict[tuple[str, str], _Start] = field(default_factory=dict)
    _cached: dict[tuple[str, str], int] = field(default_factory=dict)

    def record(
        self,
        tick: int,
        orders: list[Order],
        predicted: frozenset[str],
        served: set[str],
        resident: set[tuple[str, str]],
    ) -> None:
        """Fold one tick.

        Args:
            tick: the minute.
            orders: the orders the control issued this tick.
            predicted: models whose demand this tick was inferred only.
            served: models that served at least one request this minute.
            resident: (host, model) pairs resident (any state) after this minute.
        """
        loads = {(o.host_id, o.model_id) for o in orders if o.kind == "load"}
        for o in orders:
            key = (o.host_id, o.model_id)
            if o.kind == "load" and o.reason == PREDICTIVE_FETCH:
                self.downloads += 1
                self.cache_only += 1
                self._cached[key] = tick
            elif o.kind == "load" and o.model_id in predicted:
                self.downloads += 1
            elif o.kind == "warm" and key in self._cached:
                # A later start found the predictive download on disk: a real cache hit.
                self.cache_hits += 1
                self.leads_s.append((tick - self._cached.pop(key)) * TICK_S)
                p = self.profiles.get(o.model_id)
                self.avoided_load_s += p.load_estimate_s if p is not None else 0.0
            elif o.kind == "warm" and o.model_id in predicted:
                if key not in self._open:
                    self.starts += 1
                    self._open[key] = _Start(tick, key in loads)
            elif o.kind == "evict" and o.reason in PREDICTIVE_EVICTIONS:
                self._cached.pop(key, None)
                p = self.profiles.get(o.model_id)
                self.expiries += 1
                self.reclaimed_mb += (p.artifact_size_mb or 0) if p is not None else 0
        for key, start in list(self._open.items()):
            model = key[1]
            if start.first_use_tick is None and model in served and tick > start.tick:
                start.first_use_tick = tick
                self._hit(model, start)
            if key not in resident:
                if start.first_use_tick is None:
                    self.unused += 1
                del self._open[key]

    def _hit(self, model: str, start: _Start) -> None:
        self.hits += 1
        assert start.first_use_tick is not None
        self.leads_s.append((start.first_use_tick - start.tick) * TICK_S)
        p = self.profiles.get(model)
        if p is not None:
            self.avoided_load_s += p.warm_estimate_s + (
                p.load_estimate_s if start.downloaded else 0.0
            )

    def report(self) -> dict[str, object]:
        """The scorecard section of the scenario report (open starts without use are unused)."""
        unused = self.unused + sum(1 for s in self._open.values() if s.first_use_tick is None)
        unused += len(self._cached)
        return {
            "prefetch_downloads": self.downloads,
            "cache_only_prefetches": self.cache_only,
            "predictive_starts": self.starts,
            "hits": self.hits + self.cache_hits,
            "cache_hits": self.cache_hits,
            "unused_predictions": unused,
            "expiries": self.expiries,
            "reclaimed_mb": self.reclaimed_mb,
            "median_lead_s": statistics.median(self.leads_s) if self.leads_s else None,
            "avoided_load_s": round(self.avoided_load_s, 3),
        }
