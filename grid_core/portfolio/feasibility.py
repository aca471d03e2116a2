"""Candidate feasibility: can a model serve a workload on the live fleet, and at what cost.

Specification, "Proactive observation and portfolio planning": portfolio selection first
scans the fleet with the same hard rules placement uses — runtime, backend, GPU, tags, data
tier (immutable compatibility), then memory held by residents and the admission headroom,
model slots, colocation and artifact disk (current headroom). The scan uses the planner's own
:class:`~grid_core.planner.ledger.Ledger`, so the two can never disagree. A model no live node
can host is rejected instead of suppressing a usable fallback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from grid_core.demand.desired import startup_path_s
from grid_core.demand.types import ModelDemand
from grid_core.planner.ledger import Ledger
from grid_core.planner.types import PlannerPolicy
from grid_core.portfolio.types import MAX_PREEMPTION_PATHS
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

SERVING = frozenset({"loading", "warming", "ready"})
"""Residency states that count as the model being (or becoming) resident."""


class Row(NamedTuple):
    """One model's fleet feasibility (counts of hosts; seconds)."""

    compatible: int
    """Eligible hosts whose immutable facts allow the model."""
    feasible: int
    """Hosts where a new replica fits current headroom under every hard rule."""
    resident: int
    """Hosts where it is loading, warming or ready."""
    paths: tuple[str, ...]
    """Ranked hosts where only idle speculative residents stand in the way."""
    best_host: str | None
    startup_s: float
    """Fastest load+warm of a next replica (0 when resident)."""
    could_fit: bool
    """Some compatible host's allocatable memory could ever hold it."""


class Fit:
    """Feasibility of every profile on the fleet for one planning instant (memoised).

    Args:
        profiles: configured models.
        hosts: host snapshots (in-flight work applied).
        policy: planner policy (heartbeat limits, admission headroom).
        direct: named-model demand; a model with live direct evidence, a pin or a baseline
            is never a preemption victim for speculative demand.
    """

    def __init__(
        self,
        profiles: tuple[ModelProfile, ...],
        hosts: tuple[HostSnapshot, ...],
        policy: PlannerPolicy,
        direct: Mapping[str, ModelDemand],
    ) -> None:
        self.profiles = sorted(profiles, key=lambda p: p.model_id)
        self.hosts = sorted(hosts, key=lambda h: h.host_id)
        self.ledger = Ledger(self.profiles, self.hosts, policy)
        self.by_id = {p.model_id: p for p in self.profiles}
        self.direct = direct
        self._rows: dict[str, Row] = {}

    def protected(self, model_id: str) -> bool:
        """Directly observed service (named requests anywhere in the demand window, or
        queued work), a pin or a baseline: never a victim for speculative demand."""
        p = self.by_id.get(model_id)
        d = self.direct.get(model_id)
        named = d is not None and (d.direct or d.request_rate_rps > 0 or d.queue_depth > 0)
        return p is None or bool(p.pins) or p.min_replicas > 0 or named

    def row(self, model_id: str) -> Row:
        """The model's :class:`Row` (memoised).

        Raises:
            KeyError: ``model_id`` is not configured.
        """
        got = self._rows.get(model_id)
        if got is not None:
            return got
        ledger, mi = self.ledger, self.ledger.index[model_id]
        profile = self.profiles[mi]
        compatible = feasible = resident = 0
        paths: list[tuple[float, str]] = []
        best: tuple[float, str] | None = None
        startup: float | None = None
        could_fit = False
        for hi, host in enumerate(self.hosts):
            if ledger.compat(mi, hi) is not None or ledger.ineligible[hi] is not None:
                continue
            compatible += 1
            could_fit = could_fit or ledger.memory(mi, hi)[1] <= (
                host.allocatable_mb - host.external_used_mb
            )
            res = host.residency(model_id)
            if res is not None and res.state in SERVING:
                resident += 1
                best = (-1.0, host.host_id) if best is None or best[0] > -1.0 else best
                startup = 0.0
                continue
            cost = startup_path_s(profile, host.performance.get(model_id), ledger.cached(mi, hi))
            why = ledger.fit_new(mi, hi)
            if why is None:
                feasible += 1
                if best is None or cost < best[0]:
                    best = (cost, host.host_id)
                startup = cost if startup is None else min(startup, cost)
            elif why in ("memory", "slots", "colocation") and self._path(mi, hi):
                paths.append((cost, host.host_id))
        paths.sort()
        ranked = tuple(h for _, h in paths[:MAX_PREEMPTION_PATHS])
        if best is None and ranked:
            best = paths[0]
            startup = paths[0][0]
        out = Row(
            compatible,
            feasible,
            resident,
            ranked,
            best[1] if best else None,
            startup if startup is not None else profile.load_estimate_s + profile.warm_estimate_s,
            could_fit,
        )
        self._rows[model_id] = out
        return out

    def _path(self, mi: int, hi: int) -> bool:
        """Whether removing the host's idle speculative residents would let ``mi`` fit.

        Only managed, idle residents of models without direct demand, pins or a baseline
        count as removable; the planner still proves every real preemption itself.
        """
        host = self.hosts[hi]
        profile = self.profiles[mi]
        _, need = self.ledger.memory(mi, hi)
        book = self.ledger.books[hi]
        freed = 0
        left = set(book.present)
        for r in host.residencies:
            if r.state not in SERVING or not r.actuatable or self.protected(r.model_id):
                continue
            if r.active_requests is None or r.active_requests > 0:
                continue
            freed += r.memory_mb
            left.discard(r.model_id)
        if book.inc_free + freed < need:
            return False
        if book.max_models and len(left) + 1 > book.max_models:
            return False
        return not self.ledger.colocation_conflict(profile.model_id, left)
