"""A proven upper bound on what any control could serve in a scenario, for every fleet size.

The lab's request physics (:mod:`grid_core.scenario.serving`) serve an arrival only from a
model that is READY on a live machine, and each model's pooled device time per minute caps
its work at ``capacity × (1 + QUEUE_ALLOWANCE)``. Each logical machine holds one model at a
time. So in any minute, whatever the control did before:

* an arrival can be served only by a model that could serve it at all (the named model, or
  for ``auto`` work a model of the same modality that scores the classified workload) and
  that some live machine could run;
* the work served costs at least each arrival's *cheapest* such model's device seconds (with
  the same noise draw the physics use);
* all of it fits in the live machines' largest possible pooled capacity, each machine taking
  the most service slots any compatible model gives it, at its speed that minute
  (throttling included), plus the queue allowance.

The most arrivals whose cheapest costs fit that capacity (smallest first) therefore bound the
minute's service for every control — perfect foresight, zero cold start, every request on
its best-fitting model. Summed over minutes it is the ceiling the graduate report measures
each strategy's gap against. It is loose where routing, modality or model slots bind (one
machine serving both text and video is impossible in practice, possible here); the
hindsight oracle (:mod:`grid_core.scenario.oracle`) adds an exhaustive, tighter bound for
small fleets.
"""

from __future__ import annotations

from grid_core.scenario.arrivals import FleetEvents
from grid_core.scenario.catalog import CatalogEntry
from grid_core.scenario.config import TICK_S
from grid_core.scenario.fleet import THROTTLE_SPEED
from grid_core.scenario.serving import JITTER, QUEUE_ALLOWANCE, Served, cost_s
from grid_core.scenario.streams import stream
from grid_core.scenario.topology import Machine, compatible


class CapacityBound:
    """Accumulates the bound minute by minute (no arrival list is kept).

    Args:
        catalog: the scenario's models.
        machines: the fleet.
        events: throttle and outage windows.
        seed: the scenario seed (the bound draws the same per-arrival noise as the physics
            from its own copy of the ``outcomes`` stream).
    """

    def __init__(
        self,
        catalog: tuple[CatalogEntry, ...],
        machines: tuple[Machine, ...],
        events: FleetEvents,
        seed: int,
    ) -> None:
        self.catalog = catalog
        self.machines = machines
        self.events = events
        self.noise = stream(seed, "outcomes")
        self.served = 0
        self.requests = 0
        self._runs = {
            e.model_id: tuple(i for i, m in enumerate(machines) if compatible(e, m.kind))
            for e in catalog
        }
        self._slots = [
            max(
                (
                    min(m.kind.concurrency, e.profile.replica_concurrency)
                    for e in catalog
                    if compatible(e, m.kind)
                ),
                default=0,
            )
            for m in machines
        ]

    def _online(self, i: int, minute: int) -> bool:
        o0, o1 = self.events.outage_ticks
        return not (self.machines[i].host_id in self.events.outage and o0 <= minute < o1)

    def _speed(self, i: int, minute: int) -> float:
        m = self.machines[i]
        t0, t1 = self.events.throttle_ticks
        hot = m.host_id in self.events.throttled and t0 <= minute < t1
        return m.kind.speed * (THROTTLE_SPEED if hot else 1.0)

    def add(self, minute: int, results: list[Served]) -> int:
        """Fold one minute's arrivals (with their classified workloads) into the bound.

        Args:
            minute: the tick.
            results: the physics' per-arrival results, in arrival order (only the arrival
                and its classified workload are read).

        Returns:
            The minute's bound (requests).
        """
        live = [i for i in range(len(self.machines)) if self._online(i, minute)]
        capacity = sum(TICK_S * self._slots[i] * self._speed(i, minute) for i in live)
        capacity *= 1.0 + QUEUE_ALLOWANCE
        usable = {mid for mid, hosts in self._runs.items() if any(i in live for i in hosts)}
        costs = []
        for s in results:
            noise = 1.0 + self.noise.uniform(-JITTER, JITTER)
            a = s.arrival
            best = None
            for e in self.catalog:
                if e.model_id not in usable:
                    continue
                if a.requested_model != "auto":
                    ok = e.model_id == a.requested_model
                else:
                    ok = e.modality == a.modality and (
                        e.profile.workload_scores.get(s.workload or "", 0.0) > 0
                    )
                if ok:
                    c = cost_s(e, a) * noise
                    best = c if best is None else min(best, c)
            if best is not None:
                costs.append(best)
        costs.sort()
        n = 0
        used = 0.0
        for c in costs:
            if used + c > capacity:
                break
            used += c
            n += 1
        self.served += n
        self.requests += len(results)
        return n

    def report(self) -> dict[str, object]:
        """``{"served", "requests", "served_fraction", "meaning"}`` for the scenario report."""
        return {
            "served": self.served,
            "requests": self.requests,
            "served_fraction": round(self.served / self.requests, 6) if self.requests else 1.0,
            "meaning": (
                "proven upper bound for every control: each request on its cheapest capable "
                "model, zero cold start, the live fleet's largest pooled capacity per minute"
            ),
        }
