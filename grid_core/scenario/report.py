"""Scenario metrics and the stable report schema.

The report is plain JSON-compatible data with sorted keys and rounded floats, so the same
seed gives byte-identical output. Nothing time-of-day or machine-specific goes in it (run
time is printed by the CLI, never stored in the report).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from grid_core.demand.features import WORKLOADS
from grid_core.scenario.catalog import CatalogEntry
from grid_core.scenario.fleet import SimFleet
from grid_core.scenario.serving import Pool, Served
from grid_core.scenario.strategies import StepReport
from grid_core.scenario.topology import Machine, compatible

SCHEMA_VERSION = 1
DIGITS = 6
"""Floats are rounded to six digits: stable across platforms, finer than any decision."""
WEIGHTS = {
    "served": 0.30,
    "suitability": 0.15,
    "slo": 0.20,
    "lifecycle": 0.10,
    "safety": 0.10,
    "coverage": 0.15,
}
"""Overall score weights; served demand and SLO dominate, churn and safety still count."""
COVERAGE_K = 9.0
"""log(1 + 9x)/log(10): abandoning a workload costs far more than the last few percent."""
CHURN_SCALE = 0.25
"""Lifecycle efficiency 1/(1 + 0.25 x mutations per machine-hour): 4 moves/machine-hour = 0.5."""
MIN_USER_REQUESTS = 3
"""Users with fewer requests are too noisy to be the least-served user."""
MAX_TIMELINE_EVENTS = 40
"""Events kept per timeline tick; the counts are always complete."""


def r6(x: float) -> float:
    """Round for the report (NaN/inf never reach it: callers guard divisions)."""
    return round(float(x), DIGITS)


def ratio(a: float, b: float, empty: float = 1.0) -> float:
    """``a / b``, or ``empty`` when nothing was asked for."""
    return a / b if b else empty


def allocatable_workloads(
    catalog: tuple[CatalogEntry, ...], machines: tuple[Machine, ...]
) -> tuple[str, ...]:
    """Workloads some configured model could serve on some machine of the fleet."""
    out = []
    for w in WORKLOADS:
        if any(
            e.profile.workload_scores.get(w, 0) > 0 and compatible(e, m.kind)
            for e in catalog
            for m in machines
        ):
            out.append(w)
    return tuple(out)


@dataclass
class _Tally:
    requests: int = 0
    served: int = 0
    slo_met: int = 0
    unavailable: int = 0
    rejected: int = 0
    suitability: float = 0.0


@dataclass
class Metrics:
    """Accumulates everything the report needs, tick by tick."""

    catalog: tuple[CatalogEntry, ...]
    machines: tuple[Machine, ...]
    allocatable: tuple[str, ...]
    total: _Tally = field(default_factory=_Tally)
    by_workload: dict[str, _Tally] = field(default_factory=lambda: defaultdict(_Tally))
    by_user: dict[int, _Tally] = field(default_factory=lambda: defaultdict(_Tally))
    user_persona: dict[int, str] = field(default_factory=dict)
    admission: dict[str, dict[str, int]] = field(default_factory=dict)
    blockers: dict[str, dict[str, int]] = field(default_factory=dict)
    """Workload → model occupying a usable machine → minutes the workload waited behind it."""
    overloaded: dict[str, int] = field(default_factory=dict)
    shortfall: dict[str, int] = field(default_factory=dict)
    memory_fraction: list[float] = field(default_factory=list)
    timeline: list[dict[str, object]] = field(default_factory=list)
    orders: int = 0

    def record(
        self,
        tick: int,
        changes: list[str],
        step: StepReport,
        results: list[Served],
        pools: dict[str, Pool],
        fleet: SimFleet,
        mapping: dict[str, str],
    ) -> None:
        """Fold one tick: its node changes, the control's step and the minute's service."""
        for s in results:
            self._count(s)
        self.orders += len(step.orders)
        self._memory(fleet)
        for mid, pool in sorted(pools.items()):
            if pool.failed or pool.queued:
                self.overloaded[mid] = self.overloaded.get(mid, 0) + 1
        unmet = []
        if step.plan is not None:
            for u in step.plan.unmet:
                self.shortfall[u.model_id] = self.shortfall.get(u.model_id, 0) + 1
                unmet.append(f"{u.code}:{u.model_id}")
        states = self._admission(results, pools, fleet, step, mapping)
        self._timeline(tick, changes, fleet, unmet, pools, states)

    def _count(self, s: Served) -> None:
        w = s.workload or "unclassified"
        for t in (self.total, self.by_workload[w], self.by_user[s.arrival.user]):
            t.requests += 1
            if s.outcome == "ok":
                t.served += 1
                t.suitability += s.suitability
                t.slo_met += 1 if s.slo_ok else 0
            elif s.outcome == "unavailable":
                t.unavailable += 1
            else:
                t.rejected += 1
        self.user_persona[s.arrival.user] = s.arrival.persona

    def _memory(self, fleet: SimFleet) -> None:
        used = sum(n.used_mb() for n in fleet.nodes.values() if n.online)
        room = sum(n.allocatable_mb for n in fleet.nodes.values() if n.online)
        self.memory_fraction.append(ratio(used, room, 0.0))

    def _admission(
        self,
        results: list[Served],
        pools: dict[str, Pool],
        fleet: SimFleet,
        step: StepReport,
        mapping: dict[str, str],
    ) -> dict[str, str]:
        """Admission state per active unbound workload this minute."""
        active = sorted(
            {s.workload for s in results if s.workload and s.arrival.requested_model == "auto"}
        )
        states: dict[str, str] = {}
        planned = {a.model_id for a in step.plan.assignments} if step.plan else set()
        starting = {
            r.model_id
            for n in fleet.nodes.values()
            if n.online
            for r in n.residencies.values()
            if r.state == "loading"
        }
        for w in active:
            model = mapping.get(w)
            if model is None:
                state = "infeasible"
            elif model in pools:
                state = "undersupplied" if pools[model].failed else "ready"
            elif model in starting:
                state = "starting"
            elif model in planned:
                state = "planned"
            else:
                state = "deferred"
            states[w] = state
            row = self.admission.setdefault(w, {})
            row[state] = row.get(state, 0) + 1
            if state in ("deferred", "planned") and model is not None:
                self._blockers(w, model, fleet)
        return states

    def _blockers(self, workload: str, model: str, fleet: SimFleet) -> None:
        """Charge a minute to every model occupying a machine the waiting model could use."""
        entry = fleet.entries[model]
        row = self.blockers.setdefault(workload, {})
        for node in fleet.nodes.values():
            if not node.online or not compatible(entry, node.machine.kind):
                continue
            for occupant in node.residencies:
                if occupant != model:
                    row[occupant] = row.get(occupant, 0) + 1

    def _timeline(
        self,
        tick: int,
        changes: list[str],
        fleet: SimFleet,
        unmet: list[str],
        pools: dict[str, Pool],
        states: dict[str, str],
    ) -> None:
        moves = [
            f"{what} {model}@{host}"
            for t, host, model, what in fleet.counters.transitions
            if t == tick
        ]
        overloaded = sorted(m for m, p in pools.items() if p.failed)
        if not (changes or moves or overloaded):
            return
        self.timeline.append(
            {
                "tick": tick,
                "nodes": changes[:MAX_TIMELINE_EVENTS],
                "residency": moves[:MAX_TIMELINE_EVENTS],
                "unmet": unmet[:MAX_TIMELINE_EVENTS],
                "overloaded": overloaded,
                "admission": dict(sorted(states.items())),
            }
        )

    # --- the report ------------------------------------------------------------------------
    def report(self, fleet: SimFleet, hours: float) -> dict[str, object]:
        """The demand, lifecycle, safety and score sections of the report."""
        c = fleet.counters
        t = self.total
        mutations = c.loads + c.unloads
        violations = sum(c.violations.values())
        parts = self._score_parts(fleet, hours)
        overall = sum(WEIGHTS[k] * v for k, v in parts.items())
        return {
            "demand": self._demand_section(),
            "slo": {
                "attainment": r6(ratio(t.slo_met, t.requests)),
                "attainment_allocatable": r6(parts["slo"]),
            },
            "suitability": r6(parts["suitability"]),
            "memory": {
                "mean_used_fraction": r6(
                    ratio(sum(self.memory_fraction), len(self.memory_fraction), 0.0)
                ),
                "peak_used_fraction": r6(max(self.memory_fraction, default=0.0)),
            },
            "lifecycle": {
                "cold_starts": c.loads,
                "unloads": c.unloads,
                "deferred_unloads": c.deferred_unloads,
                "mutations": mutations,
                "orders": self.orders,
                "cache_hits": c.cache_hits,
                "cache_locality": r6(ratio(c.cache_hits, c.loads, 0.0)),
                "downloads": c.downloads,
                "downloaded_mb": c.downloaded_mb,
                "evictions": c.evictions,
                "preemptions_of_last_replica": c.preemptions,
                "refused": dict(sorted(c.refused.items())),
                "disk_used_mb": sum(n.disk_used_mb for n in fleet.nodes.values()),
            },
            "admission_minutes": {
                w: dict(sorted(v.items())) for w, v in sorted(self.admission.items())
            },
            "admission_blocker_minutes": {
                w: dict(sorted(v.items())) for w, v in sorted(self.blockers.items())
            },
            "overloaded_minutes": dict(sorted(self.overloaded.items())),
            "shortfall_minutes": dict(sorted(self.shortfall.items())),
            "capacity_recommendations": self._recommendations(),
            "safety": {
                "violations": {
                    k: c.violations.get(k, 0)
                    for k in ("overcommit", "ineligible_placement", "last_replica_loss")
                },
                "total": violations,
                "samples": list(c.violation_samples),
            },
            "score": {
                "overall": r6(overall),
                "components": {k: r6(v) for k, v in parts.items()},
                "weights": WEIGHTS,
            },
            "timeline": self.timeline,
        }

    def _score_parts(self, fleet: SimFleet, hours: float) -> dict[str, float]:
        """The score's components, each in [0, 1], keyed as :data:`WEIGHTS`: served share,
        mean suitability of the served, SLO attainment and log-scaled coverage of the
        allocatable workloads, churn per node-hour (lifecycle) and violations (safety)."""
        c = fleet.counters
        t = self.total
        alloc = [self.by_workload[w] for w in self.allocatable if w in self.by_workload]
        alloc_req = sum(x.requests for x in alloc)
        mutations = c.loads + c.unloads
        churn = ratio(mutations, len(fleet.nodes) * hours, 0.0)
        coverage = ratio(
            sum(
                math.log1p(COVERAGE_K * ratio(x.served, x.requests)) / math.log1p(COVERAGE_K)
                for x in alloc
            ),
            len(alloc),
        )
        return {
            "served": ratio(t.served, t.requests),
            "suitability": ratio(t.suitability, t.served, 0.0),
            "slo": ratio(sum(x.slo_met for x in alloc), alloc_req),
            "lifecycle": 1.0 / (1.0 + CHURN_SCALE * churn),
            "safety": 1.0 / (1.0 + sum(c.violations.values())),
            "coverage": coverage,
        }

    def _demand_section(self) -> dict[str, object]:
        t = self.total
        by_w = {}
        for w, x in sorted(self.by_workload.items()):
            by_w[w] = {
                "requests": x.requests,
                "served": x.served,
                "served_fraction": r6(ratio(x.served, x.requests)),
                "slo_attainment": r6(ratio(x.slo_met, x.requests)),
                "unavailable": x.unavailable,
                "rejected": x.rejected,
                "allocatable": w in self.allocatable,
            }
        users = [
            (ratio(x.served, x.requests), u)
            for u, x in self.by_user.items()
            if x.requests >= MIN_USER_REQUESTS
        ]
        least_user = None
        if users:
            frac, u = min(users)
            least_user = {
                "user": u,
                "persona": self.user_persona[u],
                "requests": self.by_user[u].requests,
                "served_fraction": r6(frac),
            }
        alloc = [
            (ratio(x.served, x.requests), w)
            for w, x in self.by_workload.items()
            if w in self.allocatable and x.requests
        ]
        least_w = None
        if alloc:
            frac, w = min(alloc)
            x = self.by_workload[w]
            least_w = {
                "workload": w,
                "requests": x.requests,
                "served": x.served,
                "served_fraction": r6(frac),
            }
        return {
            "requests": t.requests,
            "served": t.served,
            "unavailable": t.unavailable,
            "rejected": t.rejected,
            "served_fraction": r6(ratio(t.served, t.requests)),
            "by_workload": by_w,
            "least_served_user": least_user,
            "least_served_workload": least_w,
            "unallocatable_workloads": [w for w in WORKLOADS if w not in self.allocatable],
        }

    def _recommendations(self) -> list[str]:
        out = []
        for w in WORKLOADS:
            if w not in self.allocatable and self.by_workload.get(w, _Tally()).requests:
                out.append(
                    f"{w}: no configured model can run on this fleet; add a machine "
                    "whose runtime/backend/GPU fits a model that scores this workload"
                )
        for mid, minutes in sorted(self.overloaded.items(), key=lambda kv: (-kv[1], kv[0])):
            if minutes >= 5:
                out.append(
                    f"{mid}: overloaded for {minutes} min; add capacity for it or "
                    "raise its max_replicas"
                )
        return out[:20]
