"""The built-in joint portfolio search against a stand-in planner.

Specification, "Proactive observation and portfolio planning":

* a joint portfolio introduces at most one preemption-only model per control tick, and the
  scarce-fleet objective first maximises the admitted workloads the evaluated plan actually
  covers. When most workloads' leaders are preemption-only, the search must still move the
  others onto a model the fleet can serve (the resident generalist) instead of answering with
  the leaders' map, which the planner cannot place and which covers nothing. A workload
  whose only candidate is preemption-only keeps it (it only fills capacity as it frees up);
* a temporary outage does not switch portfolio policy: a nominally roomy fleet with a host
  out keeps the preferred map instead of consolidating workloads for the outage's minutes.
"""

from __future__ import annotations

from collections.abc import Mapping

from grid_portfolio.search import search

from grid_core.api import (
    Candidate,
    PortfolioSnapshot,
    WorkloadDemand,
)
from grid_core.planner.types import Assignment, Plan
from grid_core.snapshot import HostSnapshot

NOW = 1_790_000_000.0
GENERAL = "general"
"""The one resident model: it scores every text workload, below each specialist."""
SPECIALISTS = {
    "coding": "coder",
    "research": "researcher",
    "marketing": "writer",
    "image": "painter",
    "embedding": "embedder",
}
"""Workload → its specialist leader, none resident and none fitting now (two full hosts)."""
TEXT = ("coding", "research", "marketing")


def _cand(w: str, m: str, utility: float, resident: bool) -> Candidate:
    return Candidate(
        workload=w,
        model_id=m,
        suitability=utility / 100,
        compatible_hosts=2,
        feasible_now=0,
        resident=1 if resident else 0,
        preemption_paths=() if resident else ("h2",),
        utility=utility,
    )


def _snapshot() -> PortfolioSnapshot:
    candidates: dict[str, tuple[Candidate, ...]] = {}
    for w, spec in SPECIALISTS.items():
        rows = [_cand(w, spec, 90.0, resident=False)]
        if w in TEXT:
            rows.append(_cand(w, GENERAL, 55.0, resident=True))
        candidates[w] = tuple(rows)
    workloads = {
        w: WorkloadDemand(workload=w, offered_concurrency=1.0 + i, admitted=True, observations=9)
        for i, w in enumerate(SPECIALISTS)
    }
    return PortfolioSnapshot(
        now=NOW, workloads=workloads, profiles=(), hosts=(), candidates=candidates
    )


class _Fleet:
    """A planner stand-in: only the resident generalist can be placed (both hosts are full,
    and no map here stages a preemption)."""

    def __init__(self) -> None:
        self.budget = 64
        self.maps: list[dict[str, str]] = []

    def evaluate(self, mapping: Mapping[str, str]) -> Plan:
        self.budget -= 1
        self.maps.append(dict(mapping))
        return _plan_of(sorted({m for m in mapping.values() if m == GENERAL}))


def test_a_map_of_preemption_only_leaders_falls_back_to_the_served_generalist() -> None:
    fleet = _Fleet()
    decision = search(_snapshot(), fleet)
    assert decision is not None
    # Every text workload ends on the model the fleet can actually serve.
    assert {w: decision.mapping.get(w) for w in TEXT} == dict.fromkeys(TEXT, GENERAL)
    # Image and embedding have no other candidate: they keep their only model (demand that
    # fills capacity as it frees up), and no evaluated map adds a preemption-only model to
    # those the workloads leave no way around.
    assert decision.mapping["image"] == "painter"
    assert decision.mapping["embedding"] == "embedder"
    unavoidable = {"painter", "embedder"}
    for mapping in fleet.maps[1:]:  # the first is the start map
        assert {m for m in mapping.values() if m != GENERAL} <= unavoidable, mapping


def _plan_of(placed: list[str]) -> Plan:
    return Plan(
        assignments=tuple(
            Assignment(
                model_id=m,
                host_id="h1",
                incumbent=True,
                runtime="llama.cpp",
                memory_mb=1_000,
                reason="demand",
            )
            for m in placed
        ),
        desired={m: 1 for m in placed},
    )


class _OneLiveSlot:
    """A planner stand-in for two one-slot hosts with the second out: it places only the
    model serving the most workloads of a map (ties: model id)."""

    budget = 64

    def evaluate(self, mapping: Mapping[str, str]) -> Plan:
        counts: dict[str, int] = {}
        for m in mapping.values():
            counts[m] = counts.get(m, 0) + 1
        best = min(counts, key=lambda m: (-counts[m], m)) if counts else None
        return _plan_of([best] if best else [])


def _outage_snapshot(out: tuple[str, ...]) -> PortfolioSnapshot:
    hosts = tuple(
        HostSnapshot(host_id=h, capacity_mb=64_000, max_models=1, heartbeat_age_s=1.0)
        for h in ("h1", "h2")
    )
    candidates = {
        "coding": (_cand("coding", "coder", 90.0, True), _cand("coding", GENERAL, 50.0, True)),
        "research": (
            _cand("research", "researcher", 90.0, True),
            _cand("research", GENERAL, 50.0, True),
        ),
    }
    workloads = {
        w: WorkloadDemand(workload=w, offered_concurrency=1.0, admitted=True, observations=9)
        for w in candidates
    }
    return PortfolioSnapshot(
        now=NOW,
        workloads=workloads,
        profiles=(),
        hosts=hosts,
        candidates=candidates,
        out_hosts=out,
    )


def test_an_outage_on_a_nominally_roomy_fleet_keeps_the_preferred_map() -> None:
    preferred = {"coding": "coder", "research": "researcher"}
    decision = search(_outage_snapshot(("h2",)), _OneLiveSlot())
    assert decision is not None and decision.mapping == preferred
    assert "out" in decision.reason
    # The same live capacity without an outage is a scarce fleet: the search consolidates.
    scarce = search(_outage_snapshot(()), _OneLiveSlot())
    assert scarce is not None and scarce.mapping == dict.fromkeys(preferred, GENERAL)
