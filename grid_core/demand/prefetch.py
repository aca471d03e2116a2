"""The predictive cache: cache-only prefetch advisories and their lifecycle, as pure decisions.

Source: specification, "Proactive observation and portfolio planning" (a correlation-only
prediction that cannot receive a serving slot may stage a cache-only advisory: exact
operator-authorized source, SHA-256, declared size, authenticated free disk, a 10 GiB floor;
it fetches and verifies but never warms or evicts an incumbent) and the scenario lab's
predictive-cache lifecycle (6 h TTL for unused predictive artifacts, exact-SHA fenced; value
per MB ranking with lead time, recomputed after each chosen transfer; replacement at ≥ 2×
value per byte after 15 min maturity with at most 3 victims, as a two-generation transition).

:func:`plan_prefetch` takes the inferred demand of this tick, the authoritative plan's serving
assignments, the hosts and the node-reported provenance of predictive cache entries, and
answers what to fetch and what to evict. Nothing here reads a clock or the disk.

Two-generation replacement: when authenticated disk cannot take a stronger prediction, the
decision evicts the exact victims *only*. Deleted bytes are never credited as free in the same
decision; the fetch is planned by a later call whose host snapshot (a newer heartbeat) proves
the disk was reclaimed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Protocol

import msgspec

from grid_core.demand.inference import InferredDemand, PlanLike, Released
from grid_core.demand.types import ModelDemand
from grid_core.eligibility import NEW_WORK_STATES, incompatibility
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

MIB_PER_GIB = 1024
PREDICTIVE_FLOOR_MB = 10 * MIB_PER_GIB
"""Free disk a speculative transfer must leave (MB): 10 GiB by default (specification), so a
guess can never fill the disk that real work, logs and the OS need."""
PREDICTIVE_TTL_S = 6 * 3600.0
"""An unused predictive artifact expires after six hours (specification default)."""
REPLACEMENT_GAIN = 2.0
"""An incoming prediction replaces cached predictions only at twice their value per byte."""
MIN_MATURITY_S = 900.0
"""A predictive artifact must have spent 15 minutes in cache before it can be replaced."""
MAX_VICTIMS = 3
"""At most three victims per replacement (specification default)."""
MAX_PREFETCHES = 2
"""Predictive transfers chosen per decision: a bounded budget, so guesses never stampede the
network while real loads wait (the mutation governor still applies its own limits)."""
VICTIM_POOL = 6
"""Victims searched per host: the union of the three lowest-value and three largest mature
entries (bounded search, C(6, ≤3) = 41 subsets)."""

AdvisoryKind = Literal["fetch", "evict"]
PREDICTIVE_FETCH = "predictive_prefetch"
"""Reason of a cache-only predictive load (the node keeps the download's provenance)."""


class PredictiveEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A node's provenance record of one artifact it downloaded because of a prediction.

    Attributes:
        host_id: the node.
        model_id: the model the artifact belongs to.
        artifact_sha256: exact SHA-256 of the cached file.
        size_mb: its size (MB).
        cached_at: when the verified download finished (server-clock Unix seconds).
        used: a residency has started from it since (it is then ordinary cache).
    """

    host_id: str
    model_id: str
    artifact_sha256: str
    size_mb: int
    cached_at: float
    used: bool = False


class PrefetchInputs(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one prefetch decision reads.

    Attributes:
        now: planning instant (Unix seconds).
        predictions: this tick's inferred demand rows.
        profiles: configured models by id.
        hosts: current snapshots (authenticated free disk, cache, capabilities, timings).
        served: models that received a serving slot in the authoritative plan (they need no
            advisory: the ordinary placement fetches them).
        demanded: models with direct or queued demand, baseline or pins (never victims).
        reserved_mb: host → artifact MB the plan's uncached assignments will take (the
            post-assignment disk ledger: predictions never race demanded loads for space).
        entries: predictive cache provenance reported by the nodes.
        floor_mb: the planner reserve a speculative transfer must leave; 0 disables it.
        budget: at most this many transfers.
        homes: model → hosts it would start on if its predicted request arrived now
            (:func:`prediction_homes`); a transfer goes only there, since weights cached
            where the real request will not land save nothing. A model without homes (or
            ``None``): any eligible host.
    """

    now: float
    predictions: tuple[InferredDemand, ...]
    profiles: Mapping[str, ModelProfile]
    hosts: tuple[HostSnapshot, ...]
    served: frozenset[str] = frozenset()
    demanded: frozenset[str] = frozenset()
    reserved_mb: Mapping[str, int] = {}
    entries: tuple[PredictiveEntry, ...] = ()
    floor_mb: int = PREDICTIVE_FLOOR_MB
    budget: int = MAX_PREFETCHES
    homes: Mapping[str, frozenset[str]] | None = None


class Advisory(msgspec.Struct, frozen=True, kw_only=True):
    """One cache-only action: fetch-and-verify (never warm) or evict an exact artifact.

    Attributes:
        kind: ``fetch`` or ``evict``.
        host_id / model_id / artifact_sha256 / size_mb: the exact artifact and where.
        reason: ``predictive_prefetch``, ``predictive_ttl`` or ``predictive_replace``.
        value_per_mb: the ranking value (seconds of expected startup saved per MB).
        edge / confidence: the prediction behind a fetch (status shows them).
    """

    kind: AdvisoryKind
    host_id: str
    model_id: str
    artifact_sha256: str
    size_mb: int
    reason: str
    value_per_mb: float = 0.0
    edge: str = ""
    confidence: float = 0.0


class PrefetchDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`plan_prefetch` decided and what it refused (for status).

    Attributes:
        advisories: fetches and evictions, evictions first.
        refused: ``model: reason`` for predictions that got no advisory.
    """

    advisories: tuple[Advisory, ...] = ()
    refused: tuple[str, ...] = ()


def fetch_seconds(profile: ModelProfile, host: HostSnapshot) -> float:
    """Learned artifact fetch time on ``host`` (seconds), else the profile's load prior."""
    perf = host.performance.get(profile.model_id)
    if perf is not None and perf.fetch_s is not None:
        return perf.fetch_s
    return profile.load_estimate_s


def prefetch_value(row: InferredDemand, profile: ModelProfile, host: HostSnapshot) -> float:
    """Expected startup seconds a cached copy on ``host`` saves, weighted by confidence and
    pressure.

    Only transfer work that can finish before the predicted request counts: with a learned lead
    time the saving is ``min(fetch, lead)``; without one, the whole fetch time. Pressure is the
    predicted requests within a minute (at least one).
    """
    fetch = fetch_seconds(profile, host)
    saved = min(fetch, row.lead_s) if row.lead_s is not None else fetch
    pressure = max(1.0, row.rate_rps * 60.0)
    return row.confidence * pressure * max(0.0, saved)


def _eligible(profile: ModelProfile, host: HostSnapshot) -> bool:
    """A future-compatible host: it accepts new placements (a throttled host does, within its
    throttled share), reports authenticated free disk and can load the model."""
    return (
        host.authenticated
        and host.healthy
        and host.state in NEW_WORK_STATES
        and "load" in host.actuator_capabilities
        and host.artifact_disk_free_mb is not None  # missing telemetry never authorizes
        and incompatibility(profile, host) is None
    )


def _authorized(profile: ModelProfile) -> bool:
    return bool(profile.artifact_source and profile.artifact_sha256 and profile.artifact_size_mb)


def expirations(inp: PrefetchInputs) -> list[Advisory]:
    """Unused predictive artifacts past :data:`PREDICTIVE_TTL_S` with no demand left.

    Exact-SHA fenced: only an entry whose provenance SHA is the one the host reports cached
    for that model is named. Used, demanded, predicted-now or active artifacts stay, and a host
    without the ``evict`` capability is never asked.
    """
    hosts = {h.host_id: h for h in inp.hosts}
    predicted = {r.model_id for r in inp.predictions}
    out: list[Advisory] = []
    for e in sorted(inp.entries, key=lambda e: (e.host_id, e.model_id)):
        h = hosts.get(e.host_id)
        if (
            h is None
            or e.used
            or inp.now - e.cached_at < PREDICTIVE_TTL_S
            or e.model_id in inp.demanded
            or e.model_id in predicted
            or "evict" not in h.actuator_capabilities
            or h.cached.get(e.model_id) != e.artifact_sha256
            or h.residency(e.model_id) is not None
        ):
            continue
        out.append(
            Advisory(
                kind="evict",
                host_id=e.host_id,
                model_id=e.model_id,
                artifact_sha256=e.artifact_sha256,
                size_mb=e.size_mb,
                reason="predictive_ttl",
            )
        )
    return out


def plan_prefetch(inp: PrefetchInputs) -> PrefetchDecision:
    """Cache-only advisories for predictions that got no serving slot, and cache expiry.

    Steps: expire stale unused predictive artifacts; then, while the budget lasts, choose the
    (prediction, host) with the best value per MB among hosts whose authenticated free disk,
    after the plan's reserved bytes and earlier choices, stays at or above the floor; after
    each choice the disk ledger changes and the values are recomputed. A prediction no host has
    room for may instead evict a proven group of mature predictive victims (see
    :func:`replacement`) and fetch on a later call.

    Returns:
        The decision: evictions first, then fetches, plus one refusal per skipped prediction.
    """
    advisories = expirations(inp)
    refused: list[str] = []
    ledger = {
        h.host_id: (h.artifact_disk_free_mb or 0) - inp.reserved_mb.get(h.host_id, 0)
        for h in inp.hosts
    }
    best_rows: dict[str, InferredDemand] = {}
    for r in inp.predictions:
        old = best_rows.get(r.model_id)
        if old is None or (r.confidence, r.rate_rps) > (old.confidence, old.rate_rps):
            best_rows[r.model_id] = r
    todo: dict[str, InferredDemand] = {}
    for model_id, r in sorted(best_rows.items()):
        p = inp.profiles.get(model_id)
        if model_id in inp.served:
            continue
        if p is None or not _authorized(p):
            refused.append(f"{model_id}: no operator-authorized source, SHA-256 and size")
            continue
        if any(h.cached.get(model_id) == p.artifact_sha256 for h in _targets(inp, p, model_id)):
            continue  # already cached where it would start
        todo[model_id] = r
    fetches = 0
    while todo and fetches < inp.budget:
        choice = _best_choice(inp, todo, ledger)
        if choice is None:
            break
        model_id, host, value = choice
        p = inp.profiles[model_id]
        size = p.artifact_size_mb or 0
        ledger[host.host_id] -= size
        r = todo.pop(model_id)
        advisories.append(
            Advisory(
                kind="fetch",
                host_id=host.host_id,
                model_id=model_id,
                artifact_sha256=p.artifact_sha256 or "",
                size_mb=size,
                reason=PREDICTIVE_FETCH,
                value_per_mb=round(value / size, 9),
                edge=r.edge,
                confidence=r.confidence,
            )
        )
        fetches += 1
    evicting = {a.host_id for a in advisories if a.kind == "evict"}
    for model_id, r in sorted(todo.items()):
        victims = None if fetches >= inp.budget else replacement(inp, r, ledger, evicting)
        if victims:
            advisories.extend(victims)
            evicting.add(victims[0].host_id)
            fetches += 1  # the replacement spends this decision's budget slot
        else:
            refused.append(f"{model_id}: no host keeps {inp.floor_mb} MB free after the transfer")
    advisories.sort(key=lambda a: (a.kind != "evict", a.host_id, a.model_id))
    return PrefetchDecision(advisories=tuple(advisories), refused=tuple(refused))


def _targets(inp: PrefetchInputs, profile: ModelProfile, model_id: str) -> list[HostSnapshot]:
    """Eligible hosts a transfer of ``model_id`` may go to: its homes when the hypothetical
    plan found some, else every eligible host (nothing would start it now; it may start
    wherever capacity frees first)."""
    home = inp.homes.get(model_id) if inp.homes is not None else None
    return [h for h in inp.hosts if _eligible(profile, h) and (not home or h.host_id in home)]


def _best_choice(
    inp: PrefetchInputs, todo: Mapping[str, InferredDemand], ledger: Mapping[str, int]
) -> tuple[str, HostSnapshot, float] | None:
    """The feasible (model, host) with the best value per MB (ties: model id, host id)."""
    options: list[tuple[float, str, str, HostSnapshot, float]] = []
    for model_id, r in todo.items():
        p = inp.profiles[model_id]
        size = p.artifact_size_mb or 0
        for h in _targets(inp, p, model_id):
            if ledger[h.host_id] - size < inp.floor_mb:
                continue
            value = prefetch_value(r, p, h)
            if value > 0:
                options.append((-value / size, model_id, h.host_id, h, value))
    if not options:
        return None
    _, model_id, _, host, value = min(options, key=lambda o: (o[0], o[1], o[2]))
    return model_id, host, value


def _entry_value(
    e: PredictiveEntry, inp: PrefetchInputs, host: HostSnapshot, rows: Mapping[str, InferredDemand]
) -> float:
    r = rows.get(e.model_id)
    p = inp.profiles.get(e.model_id)
    return prefetch_value(r, p, host) if r is not None and p is not None else 0.0


def replacement(
    inp: PrefetchInputs,
    incoming: InferredDemand,
    ledger: Mapping[str, int],
    busy: set[str] | frozenset[str] = frozenset(),
) -> list[Advisory] | None:
    """Evictions that would make room for ``incoming``, proven before the first is issued.

    On each eligible host (with the ``evict`` capability, not already evicting), search the
    union of the lowest-value and the largest mature unused predictive entries for a set of at
    most :data:`MAX_VICTIMS` whose reclaimed bytes let the transfer keep the floor, such that
    the incoming value per MB is at least :data:`REPLACEMENT_GAIN` times the group's aggregate
    value density and its total value is at least the group's. Demanded, used, predicted-now-
    for-elsewhere, resident or inexact entries are never victims.

    Returns:
        The evictions (one host; the fetch waits for a heartbeat proving the space), or
        ``None`` when no group is proven.
    """
    p = inp.profiles[incoming.model_id]
    size = p.artifact_size_mb or 0
    rows = {r.model_id: r for r in inp.predictions}
    best: tuple[float, list[PredictiveEntry], HostSnapshot] | None = None
    for h in sorted(_targets(inp, p, incoming.model_id), key=lambda h: h.host_id):
        if h.host_id in busy or "evict" not in h.actuator_capabilities:
            continue
        value = prefetch_value(incoming, p, h)
        mature = [
            e
            for e in inp.entries
            if e.host_id == h.host_id
            and not e.used
            and e.model_id != incoming.model_id
            and e.model_id not in inp.demanded
            and e.model_id not in inp.served
            and inp.now - e.cached_at >= MIN_MATURITY_S
            and h.cached.get(e.model_id) == e.artifact_sha256
            and h.residency(e.model_id) is None
            and e.size_mb > 0
        ]
        by_value = sorted(mature, key=lambda e: (_entry_value(e, inp, h, rows), e.model_id))
        by_size = sorted(mature, key=lambda e: (-e.size_mb, e.model_id))
        pool = list(dict.fromkeys([*by_value[: VICTIM_POOL // 2], *by_size[: VICTIM_POOL // 2]]))
        for n in range(1, MAX_VICTIMS + 1):
            for group in itertools.combinations(pool, n):
                freed = sum(e.size_mb for e in group)
                if ledger[h.host_id] + freed - size < inp.floor_mb:
                    continue
                lost = sum(_entry_value(e, inp, h, rows) for e in group)
                if value < lost or value / size < REPLACEMENT_GAIN * lost / freed:
                    continue
                if best is None or lost < best[0]:
                    best = (lost, list(group), h)
    if best is None:
        return None
    _, chosen, h = best
    return [
        Advisory(
            kind="evict",
            host_id=h.host_id,
            model_id=e.model_id,
            artifact_sha256=e.artifact_sha256,
            size_mb=e.size_mb,
            reason="predictive_replace",
            edge=incoming.edge,
            confidence=incoming.confidence,
        )
        for e in sorted(chosen, key=lambda e: e.model_id)
    ]


class Placed(Protocol):
    """One assignment of the authoritative plan (``grid_core.planner.types.Assignment``)."""

    @property
    def host_id(self) -> str:
        """The host the plan serves the model on."""
        ...

    @property
    def model_id(self) -> str:
        """The model."""
        ...


def prediction_homes(
    plan_of: Callable[[dict[str, ModelDemand], Released], PlanLike],
    demand: Mapping[str, ModelDemand],
    predictions: Sequence[InferredDemand],
    assignments: Sequence[Placed],
    profiles: Mapping[str, ModelProfile],
) -> dict[str, frozenset[str]]:
    """Where each prediction that could earn a transfer would start if its request came now.

    A prediction without a serving slot is planned once more as the real request it
    predicts: direct demand for one replica at the predicted rate, which may stage a
    preemption as a real request would. The hosts of its assignments and staged preemptions
    are its *homes*: the only hosts where cached weights shorten that request's cold start
    (specification: the advisory goes to a future-compatible host). The hypothetical plan is
    never executed and runs only while some such prediction exists.

    Args:
        plan_of: (demand, residencies treated as gone) → the planner's plan.
        demand: the demand the authoritative plan was made for.
        predictions: this tick's inferred demand rows.
        assignments: the authoritative plan's assignments (served models need no transfer).
        profiles: configured models by id.

    Returns:
        model → home host ids (empty: no host would start it now); only models without a
        serving slot whose profile authorizes a fetch.
    """
    served = {a.model_id for a in assignments}
    rates: dict[str, float] = {}
    for r in predictions:
        p = profiles.get(r.model_id)
        if r.model_id in served or r.model_id not in demand or p is None or not _authorized(p):
            continue
        rates[r.model_id] = max(rates.get(r.model_id, 0.0), r.rate_rps)
    if not rates:
        return {}
    real = dict(demand)
    for model_id, rate in rates.items():
        d = real[model_id]
        real[model_id] = msgspec.structs.replace(
            d,
            direct=True,
            desired_replicas=max(1, d.desired_replicas),
            request_rate_rps=max(d.request_rate_rps, rate),
        )
    hypothetical = plan_of(real, frozenset())
    homes: dict[str, set[str]] = {m: set() for m in rates}
    for a in hypothetical.assignments:
        if a.model_id in homes:
            homes[a.model_id].add(a.host_id)
    for e in hypothetical.evictions:
        if e.beneficiary in homes:
            homes[e.beneficiary].add(e.host_id)
    return {m: frozenset(h) for m, h in homes.items()}


def prefetch_for_plan(
    now: float,
    assignments: Sequence[Placed],
    hosts: Mapping[str, HostSnapshot],
    profiles: Mapping[str, ModelProfile],
    predictions: Sequence[InferredDemand],
    demand: Mapping[str, ModelDemand],
    homes: Mapping[str, frozenset[str]] | None = None,
    floor_mb: int = PREDICTIVE_FLOOR_MB,
) -> PrefetchDecision:
    """The controller's per-tick predictive cache decision around its authoritative plan.

    Builds :class:`PrefetchInputs` from the plan and the host snapshots: predictive entries
    from each host's reported provenance, the models the plan serves, the models with real
    demand (direct, queued, baseline or pinned: never victims), and the disk ledger after the
    plan's own uncached assignments, so a guess never races a demanded load for space.

    Args:
        homes: :func:`prediction_homes` (``None``: any eligible host may take a transfer).
        floor_mb: the planner reserve (``PlannerPolicy.predictive_floor_mb``; 0 disables).

    Returns:
        :func:`plan_prefetch`'s decision; empty without predictions or predictive entries.
    """
    entries = tuple(
        PredictiveEntry(
            host_id=h.host_id,
            model_id=m,
            artifact_sha256=h.cached.get(m) or "",
            size_mb=profiles[m].artifact_size_mb or 0,
            cached_at=at,
        )
        for h in hosts.values()
        for m, at in sorted(h.predictive_cached.items())
        if m in profiles
    )
    if not predictions and not entries:
        return PrefetchDecision()
    reserved: dict[str, int] = {}
    for a in assignments:
        h, p = hosts.get(a.host_id), profiles.get(a.model_id)
        if h is not None and p is not None and a.model_id not in h.cached:
            reserved[a.host_id] = reserved.get(a.host_id, 0) + (p.artifact_size_mb or 0)
    demanded = {m for m, d in demand.items() if d.direct or d.queue_depth > 0}
    demanded |= {p.model_id for p in profiles.values() if p.min_replicas > 0 or p.pins}
    return plan_prefetch(
        PrefetchInputs(
            now=now,
            predictions=tuple(predictions),
            profiles=profiles,
            hosts=tuple(hosts[k] for k in sorted(hosts)),
            served=frozenset(a.model_id for a in assignments),
            demanded=frozenset(demanded),
            reserved_mb=reserved,
            entries=entries,
            homes=homes,
            floor_mb=floor_mb,
        )
    )
