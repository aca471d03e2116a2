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
from grid_core.eligibility import outlasts_protection
from grid_core.planner.ledger import Ledger
from grid_core.planner.types import PlannerPolicy
from grid_core.portfolio.types import MAX_PREEMPTION_PATHS
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot

SERVING = frozenset({"loading", "warming", "ready"})
"""Residency states that count as the model being (or becoming) resident."""
PRESENT = SERVING | {"draining"}
"""Residency states in which a replica has not left its host yet (serving, or draining)."""


OUTAGE_REASONS = frozenset({"stale_heartbeat", "no_heartbeat", "unhealthy_report"})
"""Host ineligibility reasons that mean a temporary outage (the host is still part of the
nominal fleet, and its last report may still list replicas that died with it); an
operator's pause or drain is a decision, not an outage."""


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


class ReclaimPath(NamedTuple):
    """One host where reclaiming excess replicas would let a starved model fit."""

    host_id: str
    victims: tuple[str, ...]
    """Models whose replica on this host gives way (each keeps its floor elsewhere)."""
    startup_s: float
    """The beneficiary's load+warm estimate on this host (the rank key)."""


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

    def out_hosts(self) -> frozenset[str]:
        """Hosts that are out right now (:data:`OUTAGE_REASONS`): their last report may
        still list ready replicas, but nothing there serves or can be counted on."""
        return frozenset(
            h.host_id
            for h, why in zip(self.hosts, self.ledger.ineligible, strict=True)
            if why in OUTAGE_REASONS
        )

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
            why = ledger.compat(mi, hi)
            if (why is not None and why != "throttled") or ledger.ineligible[hi] is not None:
                continue
            compatible += 1  # a throttled host is the model's again once it cools
            could_fit = could_fit or ledger.memory(mi, hi)[1] <= (
                host.allocatable_mb - host.external_used_mb
            )
            if why == "throttled":
                # its jobs outlast the host's protection grace: a replica there is not
                # counted (:meth:`degraded`), and a new one is neither placed nor made room for
                continue
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

    def degraded(self, hi: int, res: ResidencySnapshot) -> bool:
        """Whether the replica ``res`` on host ``hi`` cannot be counted on: the host is
        throttled and one of the model's requests would outlast its protection drain grace.
        It is then neither resident supply nor a ready copy for the portfolio, as for the
        planner (:func:`~grid_core.eligibility.outlasts_protection`)."""
        p = self.by_id.get(res.model_id)
        return p is not None and outlasts_protection(
            self.hosts[hi], p, self.ledger.policy.throttled_fraction
        )

    def degraded_pairs(self) -> frozenset[tuple[str, str]]:
        """``(host id, model id)`` of every replica :meth:`degraded` says cannot be counted
        on (only throttled hosts have any)."""
        return frozenset(
            (h.host_id, r.model_id)
            for hi, h in enumerate(self.hosts)
            if h.state == "throttled"
            for r in h.residencies
            if self.degraded(hi, r)
        )

    def _path(self, mi: int, hi: int) -> bool:
        """Whether removing the host's idle speculative residents would let ``mi`` fit.

        Only managed, idle residents of models without direct demand, pins or a baseline
        count as removable; the planner still proves every real preemption itself.
        """
        host = self.hosts[hi]
        profile = self.profiles[mi]
        need = self.ledger.admit_mb(mi, hi)
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

    def reclaimable(self, model_id: str) -> bool:
        """Whether an *excess* replica of ``model_id`` may give way to a starved workload.

        Pins, configured baselines (minimum replicas) and directly named demand (named
        requests in the live window) stay absolute fences (specification: "Pinned models,
        configured minimum replicas, and directly named demand remain absolute fences").
        In-flight or queued work alone does not fence an excess replica: the reconciler
        drains it before the unload, and the floor keeps a ready copy serving it.
        """
        p = self.by_id.get(model_id)
        if p is None or p.pins or p.min_replicas > 0:
            return False
        d = self.direct.get(model_id)
        return d is None or d.request_rate_rps <= 0

    def reclaim_paths(self, model_id: str, floors: Mapping[str, int]) -> tuple[ReclaimPath, ...]:
        """Ranked hosts (at most :data:`MAX_PREEMPTION_PATHS`) where a starved model fits once
        excess replicas of other models give way, each victim keeping ``floors[victim]``
        ready replicas on other hosts (default one: one copy of each active model stays).

        Specification, "Proactive observation and portfolio planning": the scan retains up
        to sixteen ranked paths and the controller takes the first one that preserves the
        victims' required ready-replica floor. Empty when the model is resident anywhere or
        fits current headroom somewhere (it is not starved by residency then).
        """
        ledger, mi = self.ledger, self.ledger.index[model_id]
        profile = self.profiles[mi]
        ready_on: dict[str, set[str]] = {}
        out = self.out_hosts()
        for hj, host in enumerate(self.hosts):
            if host.host_id in out:
                continue  # a silent host's last report is not a serving copy
            for r in host.residencies:
                if r.state == "ready" and not self.degraded(hj, r):
                    ready_on.setdefault(r.model_id, set()).add(host.host_id)
        paths: list[ReclaimPath] = []
        for hi, host in enumerate(self.hosts):
            if ledger.compat(mi, hi) is not None or ledger.ineligible[hi] is not None:
                continue
            res = host.residency(model_id)
            if res is not None and res.state in SERVING:
                if self.degraded(hi, res):
                    continue
                return ()
            why = ledger.fit_new(mi, hi)
            if why is None:
                return ()
            if why not in ("memory", "slots", "colocation"):
                continue
            victims = tuple(
                sorted(
                    r.model_id
                    for r in host.residencies
                    if r.state in SERVING
                    and r.actuatable
                    and r.model_id != model_id
                    and self.reclaimable(r.model_id)
                    and len(ready_on.get(r.model_id, set()) - {host.host_id})
                    >= max(1, floors.get(r.model_id, 1))
                )
            )
            if victims and self._fits_without(mi, hi, victims):
                cost = startup_path_s(
                    profile, host.performance.get(model_id), ledger.cached(mi, hi)
                )
                paths.append(ReclaimPath(host.host_id, victims, cost))
        paths.sort(key=lambda p: (p.startup_s, p.host_id))
        return tuple(paths[:MAX_PREEMPTION_PATHS])

    def _fits_without(self, mi: int, hi: int, victims: tuple[str, ...]) -> bool:
        """Whether ``mi`` fits host ``hi`` once the residents ``victims`` are gone."""
        host = self.hosts[hi]
        _, need = self.ledger.memory(mi, hi)
        book = self.ledger.books[hi]
        freed = sum(r.memory_mb for r in host.residencies if r.model_id in victims)
        left = set(book.present) - set(victims)
        if book.inc_free + freed < need:
            return False
        if book.max_models and len(left) + 1 > book.max_models:
            return False
        return not self.ledger.colocation_conflict(self.profiles[mi].model_id, left)
