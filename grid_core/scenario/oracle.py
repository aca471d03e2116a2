"""The hindsight oracle: the best placement schedule, and a proven bound above it.

For small fleets (at most 4 machines, 9 models, 240 minutes) the oracle replays the exact
observed arrivals with perfect knowledge of the future. Time is cut into blocks of
:data:`HOLD_MIN` minutes (a placement is held at least that long); in every block it scores
every compatible placement (each machine holds one compatible model or nothing), with a
machine that changes model serving nothing in the block's first minute (one-minute
load-to-ready). Service is computed by the same request physics as the simulation (same
routing, capacity, queue allowance and noise draws), so the oracle and a strategy are
measured on one scale.

Two numbers come out:

* ``ceiling_served``: a dynamic programme over blocks maximises served requests and, among
  service-maximising schedules, minimises mutations. With at most
  :data:`EXACT_MAX_PLACEMENTS` placements per block it is exhaustive (``exact``: every
  placement and transition is evaluated); above that the candidates carried per block are
  bounded by :data:`TIE_STATES` and :data:`BEAM`, so it is the best schedule *found* — an
  achievable lower bound on the optimum.
* ``upper_bound_served``: the sum over minutes of the most any placement serves in that
  minute, every placement scored exhaustively, with no load time and no hold. No control
  (and no schedule) can serve more in any minute, so it is a proven upper bound for every
  strategy; the optimum lies between the two.

Perfect foresight makes this a ceiling for development, not a production policy.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NotRequired, TypedDict

from grid_core.demand.features import RequestFeatures
from grid_core.scenario.arrivals import Arrival, FleetEvents
from grid_core.scenario.catalog import CatalogEntry
from grid_core.scenario.config import TICK_S
from grid_core.scenario.fleet import BASE_DISK_USED_MB, THROTTLE_SPEED, SimFleet
from grid_core.scenario.serving import JITTER, QUEUE_ALLOWANCE, cost_s
from grid_core.scenario.streams import stream
from grid_core.scenario.topology import Machine, compatible

HOLD_MIN = 2
"""A placement is held for at least two minutes (one block)."""
LOAD_TO_READY_MIN = 1
"""A machine that changes model serves nothing for one minute."""
TIE_STATES = 256
"""Placements carried into the schedule search per block (the tie-search cap)."""
BEAM = 24
"""Best partial schedules kept between blocks; transitions are evaluated from each."""
EXACT_MAX_PLACEMENTS = 150
"""Placements per block up to which the schedule search is exhaustive: every placement is
carried and every transition evaluated (150² = 22,500 transitions per block, seconds over a
4-hour run). Two-machine fleets are within it; larger ones use the tie cap and the beam, and
their schedule is then the best *found* (a lower bound on the optimum), bracketed from above
by ``upper_bound_served``."""
MAX_CHANGES_LISTED = 60
"""Winning placement changes listed in the report; the count is always complete."""

Placement = tuple[str | None, ...]
"""The model on each machine (``None``: empty), in fleet order."""
Path = tuple[tuple[int, Placement], ...]
"""The winning schedule: (first minute of a hold block, placement held in it)."""
_CapacityKey = tuple[int, tuple[tuple[str, float], ...]]
"""(minute, sorted (model, serving capacity in device seconds)): memo key of one minute."""
_BeamEntry = tuple[int, int, Placement, Path]
"""(requests served, mutations, last placement, schedule so far)."""


class OracleSummary(TypedDict):
    """The ``oracle`` section of the scenario report (counts are requests unless named).

    The run adds ``strategy_served``, ``gap`` and ``gap_fraction`` once it compares the
    strategy with the ceiling.
    """

    ceiling_served: int
    exact: NotRequired[bool]
    upper_bound_served: NotRequired[int]
    requests: int
    hold_minutes: int
    load_to_ready_minutes: int
    placements_per_block: int
    states_evaluated: int
    service_evaluations: int
    tie_state_cap: int
    beam: int
    mutations: int
    changes: list[dict[str, object]]
    disk_audit: dict[str, int]
    startup_audit: dict[str, bool]
    gap_meaning: str
    strategy_served: NotRequired[int]
    gap: NotRequired[int]
    gap_fraction: NotRequired[float]
    upper_bound_gap: NotRequired[int]


class _Minute:
    """One minute's arrivals, pre-classified, with their noise draws and routes."""

    def __init__(
        self, batch: tuple[Arrival, ...], workloads: list[str | None], noise: list[float]
    ) -> None:
        self.items = list(zip(batch, workloads, noise, strict=True))


def _options(
    machines: tuple[Machine, ...], catalog: tuple[CatalogEntry, ...]
) -> list[list[str | None]]:
    out = []
    for m in machines:
        out.append([None] + [e.model_id for e in catalog if compatible(e, m.kind)])
    return out


class _Scorer:
    """Served requests of one minute for a set of ready (machine → model) pairs."""

    def __init__(
        self,
        minutes: list[_Minute],
        machines: tuple[Machine, ...],
        entries: dict[str, CatalogEntry],
        events: FleetEvents,
    ) -> None:
        self.minutes = minutes
        self.machines = machines
        self.entries = entries
        self.events = events
        self.memo: dict[_CapacityKey, int] = {}
        self.evaluated = 0

    def online(self, i: int, minute: int) -> bool:
        h = self.machines[i].host_id
        o0, o1 = self.events.outage_ticks
        return not (h in self.events.outage and o0 <= minute < o1)

    def speed(self, i: int, minute: int) -> float:
        m = self.machines[i]
        t0, t1 = self.events.throttle_ticks
        hot = m.host_id in self.events.throttled and t0 <= minute < t1
        return m.kind.speed * (THROTTLE_SPEED if hot else 1.0)

    def served(self, minute: int, ready: Placement) -> int:
        caps: dict[str, float] = {}
        for i, mid in enumerate(ready):
            if mid is None or not self.online(i, minute):
                continue
            slots = min(
                self.machines[i].kind.concurrency, self.entries[mid].profile.replica_concurrency
            )
            caps[mid] = caps.get(mid, 0.0) + TICK_S * slots * self.speed(i, minute)
        key: _CapacityKey = (minute, tuple(sorted((k, round(v, 6)) for k, v in caps.items())))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        self.evaluated += 1
        used = dict.fromkeys(caps, 0.0)
        served = 0
        for a, workload, noise in self.minutes[minute].items:
            model = self._route(a, workload, caps)
            if model is None:
                continue
            cost = cost_s(self.entries[model], a) * noise
            if used[model] + cost > caps[model] * (1.0 + QUEUE_ALLOWANCE):
                continue
            used[model] += cost
            served += 1
        self.memo[key] = served
        return served

    def _route(self, a: Arrival, workload: str | None, caps: dict[str, float]) -> str | None:
        if a.requested_model != "auto":
            return a.requested_model if a.requested_model in caps else None
        best, best_score = None, 0.0
        for mid in sorted(caps):
            e = self.entries[mid]
            s = e.profile.workload_scores.get(workload or "", 0.0)
            if e.modality == a.modality and s > best_score:
                best, best_score = mid, s
        return best


def _ready_first(prev: Placement, new: Placement) -> Placement:
    return tuple(n if n is not None and n == p else None for p, n in zip(prev, new, strict=True))


def _key(p: Placement) -> tuple[str, ...]:
    """Sortable form of a placement (empty machines sort first)."""
    return tuple(x or "" for x in p)


def _mutations(prev: Placement, new: Placement) -> int:
    return sum(1 for p, n in zip(prev, new, strict=True) if p != n)


def _classified_minutes(
    arrivals: tuple[tuple[Arrival, ...], ...],
    texts: Callable[[Arrival], str],
    classify: Callable[[RequestFeatures, str], str | None],
    seed: int,
) -> list[_Minute]:
    """Each minute's arrivals with their workload (``classify`` over the request's features
    and text) and their outcome noise, drawn in arrival order from the seed's ``outcomes``
    stream (factors in ``1 ± JITTER``)."""
    jitter = stream(seed, "outcomes")
    minutes = []
    for batch in arrivals:
        workloads, noise = [], []
        for a in batch:
            noise.append(1.0 + jitter.uniform(-JITTER, JITTER))
            f = RequestFeatures(
                at=0.0,
                endpoint=a.endpoint,
                requested_model=a.requested_model,
                modality=a.modality,
                input_units=a.input_units,
                output_units=a.output_units,
            )
            workloads.append(classify(f, texts(a)))
        minutes.append(_Minute(batch, workloads, noise))
    return minutes


def run_oracle(
    catalog: tuple[CatalogEntry, ...],
    machines: tuple[Machine, ...],
    arrivals: tuple[tuple[Arrival, ...], ...],
    fleet: SimFleet,
    texts: Callable[[Arrival], str],
    classify: Callable[[RequestFeatures, str], str | None],
    events: FleetEvents,
    seed: int,
) -> OracleSummary:
    """The hindsight schedule for the observed arrivals; see the module docstring.

    Returns:
        ``ceiling_served`` (requests the best schedule serves), ``requests``,
        ``states_evaluated``, ``placements_per_block``, ``mutations``, the listed changes,
        and the artifact-disk and startup audits.
    """
    entries = {e.model_id: e for e in catalog}
    minutes = _classified_minutes(arrivals, texts, classify, seed)
    scorer = _Scorer(minutes, machines, entries, events)
    options = _options(machines, catalog)
    everything = list(itertools.product(*options))
    exact = len(everything) <= EXACT_MAX_PLACEMENTS
    empty: Placement = tuple(None for _ in machines)
    beam: list[_BeamEntry] = [(0, 0, empty, ())]
    scored = 0
    minute_best = [0] * len(minutes)
    blocks = range(0, len(minutes), HOLD_MIN)
    for b0 in blocks:
        block = [m for m in range(b0, min(b0 + HOLD_MIN, len(minutes)))]
        allowed = [
            q
            for q in everything
            if all(q[i] is None or all(scorer.online(i, m) for m in block) for i in range(len(q)))
        ]
        scored += len(allowed)
        values = []
        for q in allowed:
            per = [scorer.served(m, q) for m in block]
            for m, v in zip(block, per, strict=True):
                minute_best[m] = max(minute_best[m], v)
            values.append((sum(per), q))
        if len(allowed) < len(everything):  # a machine goes down or up inside the block
            for m in block:
                minute_best[m] = max(minute_best[m], *(scorer.served(m, q) for q in everything))
        full = sorted(values, key=lambda t: (-t[0], sum(x is not None for x in t[1]), _key(t[1])))
        allowed_set = set(allowed)
        kept = full if exact else full[:TIE_STATES]
        candidates = {q for _, q in kept} | {p for _, _, p, _ in beam if p in allowed_set}
        ordered = sorted(candidates or {empty}, key=_key)
        nxt: dict[Placement, _BeamEntry] = {}
        for value, muts, prev, path in beam:
            prev_live = tuple(
                p if all(scorer.online(i, m) for m in block) else None for i, p in enumerate(prev)
            )
            for q in ordered:
                gain = scorer.served(block[0], _ready_first(prev_live, q))
                gain += sum(scorer.served(m, q) for m in block[1:])
                cand = (value + gain, muts + _mutations(prev_live, q), q, (*path, (b0, q)))
                best = nxt.get(q)
                if best is None or (cand[0], -cand[1]) > (best[0], -best[1]):
                    nxt[q] = cand
        ranked = sorted(nxt.values(), key=lambda t: (-t[0], t[1], _key(t[2])))
        beam = ranked if exact else ranked[:BEAM]
    value, muts, _, path = beam[0]
    out = _summary(value, muts, path, machines, entries, arrivals, scorer, scored, len(everything))
    out["exact"] = exact
    out["upper_bound_served"] = sum(minute_best)
    return out


def _summary(
    value: int,
    muts: int,
    path: Path,
    machines: tuple[Machine, ...],
    entries: dict[str, CatalogEntry],
    arrivals: tuple[tuple[Arrival, ...], ...],
    scorer: _Scorer,
    scored: int,
    per_block: int,
) -> OracleSummary:
    changes: list[dict[str, object]] = []
    cached = [set(m.cached) for m in machines]
    disk = [
        BASE_DISK_USED_MB
        + sum(entries[c].profile.artifact_size_mb or 0 for c in m.cached if c in entries)
        for m in machines
    ]
    downloads = downloaded = disk_violations = 0
    prev: Placement = tuple(None for _ in machines)
    for b0, q in path:
        block = range(b0, min(b0 + HOLD_MIN, len(scorer.minutes)))
        for i, (p, n) in enumerate(zip(prev, q, strict=True)):
            if p == n:
                continue
            # A machine that is down in this block lost its model; that is not a mutation.
            lost = p is not None and not all(scorer.online(i, m) for m in block)
            if len(changes) < MAX_CHANGES_LISTED:
                changes.append(
                    {
                        "minute": b0,
                        "host": machines[i].host_id,
                        "from": p,
                        "to": n,
                        "cause": "outage" if lost else "placement",
                    }
                )
            if n is not None and n not in cached[i]:
                size = entries[n].profile.artifact_size_mb or 0
                cached[i].add(n)
                disk[i] += size
                downloads += 1
                downloaded += size
                if disk[i] > machines[i].kind.disk_mb:
                    disk_violations += 1
        prev = q
    audits_pass = disk_violations == 0
    return {
        "ceiling_served": value,
        "requests": sum(len(b) for b in arrivals),
        "hold_minutes": HOLD_MIN,
        "load_to_ready_minutes": LOAD_TO_READY_MIN,
        "placements_per_block": per_block,
        "states_evaluated": scored,
        "service_evaluations": scorer.evaluated,
        "tie_state_cap": TIE_STATES,
        "beam": BEAM,
        "mutations": muts,
        "changes": changes,
        "disk_audit": {
            "downloads": downloads,
            "downloaded_mb": downloaded,
            "violations": disk_violations,
        },
        "startup_audit": {"load_to_ready_enforced": True},
        "gap_meaning": (
            "hindsight placement opportunity independent of disk and startup limits"
            if audits_pass
            else "placement opportunity that also needs cache preparation (disk)"
        ),
    }
