"""Request physics: which READY model serves each arrival, and what it costs.

An arrival is served by a model that is READY (and on a live machine) when it arrives. A named
request goes to the named model; an unbound (``auto``) request goes where Grid's router sends
it (:func:`auto_model`): the model the control's latest portfolio maps the classified workload
to when that model is ready, else the ready model with the best configured suitability. Each
model's replicas pool their device time for the minute; work beyond that capacity first
queues (up to :data:`QUEUE_ALLOWANCE` of capacity, served late) and then fails
deterministically (``rejected``). Failures, latency inflation and queue depth are fed back
to the controller as ordinary request features.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from grid_core.demand.features import Outcome, RequestFeatures
from grid_core.scenario.arrivals import Arrival
from grid_core.scenario.catalog import CatalogEntry
from grid_core.scenario.config import TICK_S
from grid_core.scenario.fleet import SimFleet
from grid_core.scenario.personas import team_of

QUEUE_ALLOWANCE = 0.5
"""Work up to 50 % beyond a minute's capacity waits and is served late; the rest fails."""
PREFILL_S_PER_UNIT = 0.0002
"""Device seconds per input unit on the reference machine (prompt processing)."""
JITTER = 0.1
"""±10 % service-time noise from the outcomes stream (same draws for every strategy)."""
LOAD_INFLATION = 0.5
"""Latency grows by up to 50 % as a model's pooled capacity fills (contention)."""


@dataclass
class Pool:
    """One model's ready replicas this minute (device time in reference seconds)."""

    model_id: str
    capacity_s: float = 0.0
    slots: int = 0
    hosts: list[str] = field(default_factory=list)
    used_s: float = 0.0
    queued: int = 0
    failed: int = 0
    served: int = 0

    @property
    def mean_speed(self) -> float:
        """Capacity-weighted speed of the pool (reference machine = 1.0)."""
        return self.capacity_s / (TICK_S * self.slots) if self.slots else 1.0


@dataclass(frozen=True, slots=True)
class Served:
    """What happened to one arrival.

    ``model`` is the model that served it (``None`` when nothing could); ``workload`` is the
    classifier's output; ``suitability`` is the served model's score for that workload (1.0
    for named requests).
    """

    arrival: Arrival
    workload: str | None
    model: str | None
    outcome: Outcome
    latency_s: float
    queue_s: float
    service_s: float
    slo_ok: bool
    suitability: float


def pools_of(fleet: SimFleet) -> dict[str, Pool]:
    """Ready replicas per model on live machines, pooled."""
    pools: dict[str, Pool] = {}
    for node in sorted(fleet.nodes.values(), key=lambda n: n.host_id):
        if not node.online:
            continue
        for r in node.residencies.values():
            if r.state != "ready":
                continue
            slots = min(
                node.machine.kind.concurrency, fleet.entries[r.model_id].profile.replica_concurrency
            )
            pool = pools.setdefault(r.model_id, Pool(r.model_id))
            pool.capacity_s += TICK_S * slots * node.speed
            pool.slots += slots
            pool.hosts.append(node.host_id)
    return pools


def best_ready_model(
    workload: str | None, modality: str, pools: dict[str, Pool], entries: dict[str, CatalogEntry]
) -> str | None:
    """The ready model with the highest suitability for ``workload`` (ties: model id)."""
    if workload is None:
        return None
    best, best_score = None, 0.0
    for mid in sorted(pools):
        e = entries[mid]
        score = e.profile.workload_scores.get(workload, 0.0)
        if e.modality == modality and score > best_score:
            best, best_score = mid, score
    return best


def auto_model(
    workload: str | None,
    modality: str,
    pools: dict[str, Pool],
    entries: dict[str, CatalogEntry],
    chosen: Mapping[str, str],
) -> str | None:
    """The model serving an ``auto`` request, as Grid's router picks it: the portfolio's
    choice for ``workload`` (``chosen``: workload → model id, the control's last decision)
    when it is ready and serves ``modality``, else :func:`best_ready_model`. A control
    without a portfolio (greedy, static) passes an empty map and gets configured scores."""
    pick = chosen.get(workload) if workload is not None else None
    if pick is not None and pick in pools and entries[pick].modality == modality:
        return pick
    return best_ready_model(workload, modality, pools, entries)


def cost_s(entry: CatalogEntry, a: Arrival) -> float:
    """Device seconds of one request on the reference machine."""
    return entry.base_s + entry.per_unit_s * a.output_units + PREFILL_S_PER_UNIT * a.input_units


Classifier = Callable[[RequestFeatures, str], str | None]


@functools.lru_cache(maxsize=4096)
def session_hash(persona: str, project: int) -> str:
    """The double-hashed session key of a synthetic project (what the server would derive
    from ``X-Grid-Affinity-Key``; the raw key never exists in the lab at all). Members of one
    team's project share it whatever their persona."""
    team = team_of(persona)[0]
    once = hashlib.sha256(f"scenario-session/{team}/{project}".encode()).digest()
    return hashlib.sha256(once).hexdigest()[:32]


MinuteResult = tuple[list["Served"], list[RequestFeatures], dict[str, "Pool"]]


def serve_minute(
    fleet: SimFleet,
    batch: tuple[Arrival, ...],
    texts: Callable[[Arrival], str],
    classify: Classifier,
    jitter: random.Random,
    chosen: Mapping[str, str] | None = None,
) -> MinuteResult:
    """Serve one minute of arrivals with the fleet's current READY set.

    Args:
        fleet: the simulated fleet (residency activity is updated for the next snapshot).
        batch: this minute's arrivals, in arrival order.
        texts: the transient request text of an arrival (scanned, then dropped).
        classify: the production classifier: features and text → workload.
        jitter: the outcomes stream (one draw per arrival, whatever the routing).
        chosen: workload → model of the control's latest portfolio (``auto`` routing,
            :func:`auto_model`); ``None`` or empty: configured scores only.

    Returns:
        Per-arrival results, the bounded features to observe, and the pools.
    """
    now = fleet.now
    pools = pools_of(fleet)
    results: list[Served] = []
    features: list[RequestFeatures] = []
    for a in batch:
        noise = 1.0 + jitter.uniform(-JITTER, JITTER)
        base = RequestFeatures(
            at=now + a.offset_s,
            endpoint=a.endpoint,
            requested_model=a.requested_model,
            modality=a.modality,
            input_units=a.input_units,
            output_units=a.output_units,
        )
        workload = classify(base, texts(a))
        if a.requested_model != "auto":
            model = a.requested_model if a.requested_model in pools else None
        else:
            model = auto_model(workload, a.modality, pools, fleet.entries, chosen or {})
        served = _serve_one(fleet, pools, a, workload, model, noise)
        results.append(served)
        at = min(now + TICK_S - 0.001, now + a.offset_s + served.latency_s)
        features.append(
            RequestFeatures(
                at=round(at, 6),
                endpoint=a.endpoint,
                requested_model=a.requested_model,
                served_model=served.model,
                modality=a.modality,
                input_units=a.input_units,
                output_units=a.output_units,
                workload=workload,
                service_time_s=round(served.service_s, 6) if served.model else None,
                queue_s=round(served.queue_s, 6),
                outcome=served.outcome,
                affinity_hash=session_hash(a.persona, a.project),
            )
        )
    _update_activity(fleet, pools, now)
    return results, features, pools


def _serve_one(
    fleet: SimFleet,
    pools: dict[str, Pool],
    a: Arrival,
    workload: str | None,
    model: str | None,
    noise: float,
) -> Served:
    if model is None:
        return Served(a, workload, None, "unavailable", 0.0, 0.0, 0.0, False, 0.0)
    entry = fleet.entries[model]
    pool = pools[model]
    cost = cost_s(entry, a) * noise
    suitability = (
        1.0
        if a.requested_model != "auto"
        else entry.profile.workload_scores.get(workload or "", 0.0)
    )
    if pool.used_s + cost > pool.capacity_s * (1.0 + QUEUE_ALLOWANCE):
        pool.failed += 1
        return Served(a, workload, model, "rejected", 0.0, 0.0, 0.0, False, suitability)
    pool.used_s += cost
    service = cost / pool.mean_speed
    util = min(1.0, pool.used_s / pool.capacity_s)
    queue = 0.0
    if pool.used_s > pool.capacity_s:
        pool.queued += 1
        # Overflow waits for the pool to turn over: its share of a minute's capacity.
        queue = (pool.used_s - pool.capacity_s) / pool.capacity_s * TICK_S
    latency = service * (1.0 + LOAD_INFLATION * util) + queue
    pool.served += 1
    slo_ms = entry.profile.latency_slo_ms
    slo_ok = slo_ms is None or latency * 1000.0 <= slo_ms
    return Served(a, workload, model, "ok", latency, queue, service, slo_ok, suitability)


def _update_activity(fleet: SimFleet, pools: dict[str, Pool], now: float) -> None:
    """In-flight work and queues at the end of the minute, for the next snapshot."""
    for pool in pools.values():
        util = min(1.0, pool.used_s / pool.capacity_s) if pool.capacity_s else 0.0
        waiting = pool.queued + pool.failed
        for host in pool.hosts:
            r = fleet.nodes[host].residencies[pool.model_id]
            slots = min(
                fleet.nodes[host].machine.kind.concurrency,
                fleet.entries[pool.model_id].profile.replica_concurrency,
            )
            r.active = math.ceil(util * slots) if pool.served else 0
            r.queue = math.ceil(waiting / len(pool.hosts))
            if pool.served:
                r.last_used_at = now + TICK_S - 0.001
    for node in fleet.nodes.values():
        for r in node.residencies.values():
            if r.state != "ready" or r.model_id not in pools:
                r.active, r.queue = 0, 0
