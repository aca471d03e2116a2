"""The phases of one plan, in the order :func:`grid_core.planner.plan` runs them."""

from __future__ import annotations

from grid_core.demand.desired import startup_path_s
from grid_core.demand.types import STANDBY_REASON
from grid_core.eligibility import outlasts_protection
from grid_core.planner.core import PlanState, RankedPool, RoundKey, Unasked, serving_incumbents
from grid_core.planner.eligibility import MEMORY_STATES
from grid_core.planner.holds import release_hold, take_hold
from grid_core.planner.lastready import kept_ready, last_ready, settling_scale_out
from grid_core.planner.pinsets import reserve_best_pin_sets
from grid_core.planner.preemption import (
    MAX_PREEMPTION_HOSTS,
    MAX_VICTIM_CANDIDATES,
    OBSOLETE_PRIORITY,
    SURPLUS_PRIORITY,
    VictimCandidate,
    VictimContext,
    VictimNeed,
    VictimSelector,
    set_cost,
)
from grid_core.planner.types import Eviction, UnmetResource
from grid_core.profile import revision_matches
from grid_core.snapshot import ResidencySnapshot


def class_order(state: PlanState, models: list[int]) -> list[int]:
    """Priority classes high to low; inside one, a stable model order for seeding."""
    return sorted(models, key=lambda mi: round_key(state, mi))


def round_key(state: PlanState, mi: int) -> RoundKey:
    """Round order inside a class: constrained (fewer candidate hosts) and larger first,
    then more attributable harm, model id last."""
    key = state.round_keys.get(mi)
    if key is None:  # fixed for the whole plan: candidates, size, harm and id never change
        p = state.profiles[mi]
        key = (-p.priority, len(state.cands[mi]), -p.memory_mb, harm_neg(state, mi), p.model_id)
        state.round_keys[mi] = key
    return key


def harm_neg(state: PlanState, mi: int) -> tuple[float, ...]:
    """Attributable harm of a model, negated so that sorting puts the most harmed first."""
    d = state.demand[mi]
    if d is None:
        return (0.0, 0.0, 0.0, 0.0, 0.0)
    return tuple(-x for x in d.harm(state.profiles[mi].latency_slo_ms))


# --- 3. incumbents ------------------------------------------------------------------------
def seed_incumbents(state: PlanState) -> None:
    """Keep healthy live replicas first (highest priority first), up to each desired count.

    A complete current placement therefore survives as a feasibility witness: scoring never
    dismantles it. Incumbents that no longer fit the desired ledger, the host's model ceiling
    or colocation are not kept (the lowest priority loses), so they are re-placed elsewhere
    when a peer host exists, and reported otherwise.
    """
    ledger = state.ledger
    for mi in class_order(state, list(range(len(state.profiles)))):
        want = state.desired[mi]
        domains_needed = min(
            state.required_domains(mi), len({ledger.domain_list[hi] for hi in state.cands[mi]})
        )
        kept = 0
        seen: set[str] = set()
        pins = state.pin_hosts[mi]
        incumbents = serving_incumbents(state, mi)
        # A pin is reserved before anything else: replicas off the pins may only use the
        # count the open pins leave (a surplus one is re-admitted if the model stays short).
        off_pin_room = want - len(pins & set(state.cands[mi]))
        if pins:
            incumbents.sort(key=lambda t: t[0] not in pins)
        for hi, res in incumbents:
            if kept >= want:
                break
            if pins and hi not in pins:
                if off_pin_room <= 0:
                    state.deferred.setdefault(mi, []).append((hi, res))
                    state.off_pin.add((mi, hi))
                    continue
                off_pin_room -= 1
            dom = ledger.domain_list[hi]
            if dom in seen and want - kept - 1 < domains_needed - len(seen):
                # Keeping a second replica in this domain would leave no room for a domain
                # the model still needs: defer it, re-admitted if no new domain works out.
                state.deferred.setdefault(mi, []).append((hi, res))
                continue
            if ledger.fit_incumbent(mi, hi, res) is None:
                ledger.keep(mi, hi, res, "incumbent")
                kept += 1
                seen.add(dom)
    _converge_ceilings(state)


def readmit_deferred(state: PlanState, models: list[int]) -> None:
    """Keep deferred incumbents of models that are still short after their rounds.

    A replica set that stays in too few domains is better than a missing replica: the
    failure-domain shortfall is reported instead. A deferred replica that a pin's staged
    preemption already drains (it was not kept, so it counted as obsolete work there) is not
    kept: one plan never keeps and drains the same replica.
    """
    ledger = state.ledger
    for mi in models:
        mid = state.profiles[mi].model_id
        for hi, res in state.deferred.get(mi, ()):
            if ledger.count[mi] >= state.desired[mi]:
                break
            if (mid, state.hosts[hi].host_id) in state.evicted:
                continue
            if mi not in ledger.books[hi].models and ledger.fit_incumbent(mi, hi, res) is None:
                ledger.keep(mi, hi, res, "incumbent")


def _converge_ceilings(state: PlanState) -> None:
    """Evict surplus managed live work on hosts whose ceiling or colocation it breaks."""
    ledger = state.ledger
    for hi, host in enumerate(state.hosts):
        book = ledger.books[hi]
        if not book.eligible:
            continue  # a fenced host converges when it returns; no commands go there now
        live = [r for r in host.residencies if r.state in MEMORY_STATES]
        over = book.max_models and len(live) > book.max_models
        kept = {state.profiles[mi].model_id for mi in book.models}
        conflict = [
            r
            for r in live
            if r.model_id not in kept
            and r.actuatable
            and ledger.colocation_conflict(r.model_id, kept | {r.model_id})
        ]
        if not over and not conflict:
            continue
        removable = [
            r
            for r in live
            if r.actuatable
            and r.model_id not in kept
            and not _pinned_here(state, r.model_id, host.host_id)
            and not state.protected(ledger.index.get(r.model_id), r.loaded_at, r.state)
        ]
        removable.sort(
            key=lambda r: (
                _priority(state, r.model_id),
                r.state not in ("failed", "draining"),
                r.model_id,
            )
        )
        excess = len(live) - book.max_models if over else 0
        chosen = [r for r in removable if r in conflict]
        for r in removable:
            if len(chosen) >= excess:
                break
            if r not in chosen:
                chosen.append(r)
        for r in chosen:
            _evict(state, r.model_id, hi, None, _priority(state, r.model_id), "ceiling")


def _pinned_here(state: PlanState, model_id: str, host_id: str) -> bool:
    """Pinned work is never a ceiling victim on its pinned host (invariant 7)."""
    mi = state.ledger.index.get(model_id)
    return mi is not None and host_id in state.profiles[mi].pins


def _priority(state: PlanState, model_id: str) -> int:
    mi = state.ledger.index.get(model_id)
    return state.profiles[mi].priority if mi is not None else OBSOLETE_PRIORITY


def _evict(
    state: PlanState, model_id: str, hi: int, beneficiary: str | None, priority: int, reason: str
) -> bool:
    host_id = state.hosts[hi].host_id
    if (model_id, host_id) in state.evicted:
        return True
    if len(state.evictions) >= state.policy.max_evictions:
        return False
    state.evicted.add((model_id, host_id))
    state.evictions.append(
        Eviction(
            model_id=model_id,
            host_id=host_id,
            beneficiary=beneficiary,
            priority=priority,
            reason=reason,
        )
    )
    return True


# --- 4. pins ------------------------------------------------------------------------------
def place_pins(state: PlanState) -> None:
    """Reserve every hard pin on its exact host (higher priority first).

    A pin is a floor: it guarantees a replica on its host (placed here, or a preemption
    staged there and nowhere else) and demand beyond the pins is placed by the ordinary
    rounds on any compatible host. A pin whose host cannot take the replica (offline,
    incompatible, or full of work that may not be preempted) is never substituted: the
    model is then planned towards what its demand alone asks for and the pin is reported.
    Where a host's pins do not all fit, the set that honours the most pins (class by class,
    high to low) is reserved first (:func:`grid_core.planner.pinsets.reserve_best_pin_sets`).
    """
    from grid_core.planner.core import demand_count

    ledger = state.ledger
    pinned = class_order(state, [mi for mi, p in enumerate(state.profiles) if p.pins])
    reserve_best_pin_sets(state, pinned)  # a host whose pins do not all fit: the best set
    for mi in pinned:
        cands = set(state.cands[mi])
        ok = 0
        for hi in sorted(state.pin_hosts[mi]):
            if mi in ledger.books[hi].models:
                ok += 1
                continue
            if hi not in cands:
                continue
            if ledger.fit_new(mi, hi) is None:
                ledger.place(mi, hi, "pin", state.score(mi, hi, True))
                ok += 1
            elif preempt_on(state, mi, [hi], authorized=True):
                ok += 1
        want = demand_count(state.profiles[mi], state.demand[mi])
        # Live replicas already kept off the pins stay (no churn for a pin that cannot land).
        state.desired[mi] = max(ok, want, ledger.count[mi])
    readmit_deferred(state, pinned)  # keep live off-pin replicas before any new one starts


# --- 5. fair rounds -----------------------------------------------------------------------
PLACE_PHASES = ("baseline", "direct", "inferred", "standby")
"""The phases in which :func:`place_class` places one class, most important first."""


def place_class(state: PlanState, models: list[int]) -> None:
    """Baseline rounds, then direct-demand rounds, then inferred-only rounds, then standby
    rounds for one class.

    Required baselines come first and real (direct) demand before demand that is only
    inferred, so a prediction can use spare capacity but never take a slot real traffic needs;
    standby (a workload's chosen model on idle capacity before any request) comes last.
    """
    stuck = {mi for mi in models if not state.cands[mi]}  # no host could ever take them
    for phase in PLACE_PHASES:

        def target(mi: int, phase: str = phase) -> int:
            if (
                phase == "baseline"
                or (phase == "direct" and _inferred_only(state, mi))
                or (phase == "inferred" and _standby_only(state, mi))
            ):
                return min(state.profiles[mi].min_replicas, state.desired[mi])
            return state.needed(mi)  # replicas only hysteresis holds are never placed anew

        # Fixed for the phase: desired counts, demand and pins do not change in the rounds.
        goal = {mi: target(mi) for mi in models}
        count = state.ledger.count
        while True:
            active = [mi for mi in models if mi not in stuck and count[mi] < goal[mi]]
            if not active:
                break
            _fair_round(state, active, stuck)


def replica_phase(state: PlanState, mi: int, k: int) -> int:
    """Index in :data:`PLACE_PHASES` of the phase that places ``mi``'s ``k``-th replica
    (1-based): its required baseline up to ``min(min_replicas, desired)``, then the phase
    its demand belongs to (direct, inferred only, standby only). A trade inside one class
    that drops a replica of an earlier phase for replicas of later ones only would undo
    that order (specification, "Global placement loop": baselines first, then direct
    demand, then inferred prewarms)."""
    if k <= min(state.profiles[mi].min_replicas, state.desired[mi]):
        return 0
    if _standby_only(state, mi):
        return 3
    return 2 if _inferred_only(state, mi) else 1


def _inferred_only(state: PlanState, mi: int) -> bool:
    """Demand without direct evidence: inferred from correlations or workloads, or standby."""
    d = state.demand[mi]
    return d is not None and not d.direct and (d.inferred_rps > 0 or STANDBY_REASON in d.reasons)


def _standby_only(state: PlanState, mi: int) -> bool:
    """Standby demand with nothing inferred behind it (placed after every inferred round)."""
    d = state.demand[mi]
    return d is not None and not d.direct and d.inferred_rps <= 0 and STANDBY_REASON in d.reasons


def _fair_round(state: PlanState, active: list[int], stuck: set[int]) -> None:
    order = sorted(active, key=lambda mi: round_key(state, mi))
    done = _try_round(state, order)
    failed = [mi for mi, ok in zip(order, done, strict=True) if not ok]
    if failed and len(failed) < len(order):
        # Capacity ended partway through the round: attributable harm decides who keeps it.
        # When every model that got a replica is more harmed than every model that did not,
        # the round already agrees with harm and needs no replay.
        def harm_key(mi: int) -> tuple[tuple[float, ...], RoundKey]:
            return (harm_neg(state, mi), round_key(state, mi))

        by_harm = sorted(active, key=harm_key)
        placed_keys = [harm_key(mi) for mi, ok in zip(order, done, strict=True) if ok]
        agrees = min(harm_key(mi) for mi in failed) > max(placed_keys)
        if not agrees and by_harm != order:
            _undo(state, order, done)
            done2 = _try_round(state, by_harm)
            if sum(done2) >= sum(done):
                order, done = by_harm, done2
            else:
                _undo(state, by_harm, done2)
                done = _try_round(state, order)
        failed = [mi for mi, ok in zip(order, done, strict=True) if not ok]
    stuck.update(failed)


def _try_round(state: PlanState, order: list[int]) -> list[bool]:
    state.last_round = []
    done: list[bool] = []
    for mi in order:
        found = take_hold(state, mi) if state.holds.get(mi) else None
        if found is None:
            found = state.best_host(mi)
        if found is None and state.holds:
            found = release_hold(state, mi)
        if found is None:
            done.append(False)
            state.last_round.append(None)
            continue
        hi, s = found
        state.ledger.place(mi, hi, "score", s)
        state.last_round.append(hi)
        done.append(True)
    return done


def _undo(state: PlanState, order: list[int], done: list[bool]) -> None:
    for mi, hi in zip(reversed(order), reversed(state.last_round), strict=True):
        if hi is not None:
            state.ledger.remove(mi, hi)


# --- staged preemption --------------------------------------------------------------------
def preempt_rounds(state: PlanState, models: list[int]) -> None:
    """Stage preemptions for a class's missing replicas, one replica per model per round,
    so the eviction budget is shared fairly instead of spent on the first model."""
    active = [
        mi for mi in models if state.ledger.count[mi] + state.staged.get(mi, 0) < state.needed(mi)
    ]
    while active:
        still = []
        for mi in active:
            if preempt_for(state, mi) and (
                state.ledger.count[mi] + state.staged.get(mi, 0) < state.needed(mi)
            ):
                still.append(mi)
        active = still


def may_preempt(state: PlanState, mi: int) -> bool:
    """Destructive authority needs a baseline or live direct evidence (never inference); a
    pin has it on its own host only (:func:`place_pins`).

    Direct evidence covers only the replicas it asks for: replicas the scale-down cooldown
    merely holds (``held_replicas``) are hysteresis, so losing one is not a reason to evict
    other work to rebuild it.
    """
    p, d = state.profiles[mi], state.demand[mi]
    have = state.ledger.count[mi] + state.staged.get(mi, 0)
    if have < p.min_replicas:
        return True
    return d is not None and d.direct and have < state.needed(mi)


def preempt_for(state: PlanState, mi: int) -> bool:
    """Stage a preemption for one missing replica of ``mi``; True when staged."""
    domains = state.ledger.domains[mi]
    need_new = len(domains) < state.required_domains(mi)
    hosts = state.cands[mi]
    if need_new:
        fresh = [hi for hi in hosts if state.ledger.domain_of(hi) not in domains]
        if fresh and preempt_on(state, mi, fresh):
            return True
    return preempt_on(state, mi, hosts)


def preempt_on(state: PlanState, mi: int, hosts: list[int], authorized: bool = False) -> bool:
    """Choose the cheapest sufficient victim set among ``hosts`` and stage it.

    ``authorized`` grants destructive authority regardless of demand (a missing pin on its
    own host); otherwise :func:`may_preempt` decides.
    """
    select_victims = state.select_victims
    if select_victims is None or not (authorized or may_preempt(state, mi)):
        return False
    if len(state.evictions) >= state.policy.max_evictions:
        state.budget_hit.add(mi)
        return False
    options = []
    for hi in hosts:
        got = _cached_pool(state, mi, hi)
        if got is not None:
            options.append((got[0], hi))
    options.sort()
    best = None
    for _, hi in options[:MAX_PREEMPTION_HOSTS]:
        chosen = _cached_choice(state, mi, hi, select_victims)
        if chosen is None:
            continue
        cost = set_cost(chosen)
        # Among equally disruptive sets (same priority, live disruption, warm-back, count and
        # memory), release the host where the beneficiary serves soonest: exact cached
        # weights and learned load/warm times (specification, "Safety invariants" 8).
        key = (cost[:-1], _beneficiary_start_s(state, mi, hi), cost[-1], hi)
        if best is None or key < best[0]:
            best = (key, hi, chosen)
    if best is None:
        return False
    _, hi, chosen = best
    if len(state.evictions) + len(chosen) > state.policy.max_evictions:
        state.budget_hit.add(mi)
        return False
    p = state.profiles[mi]
    book = state.ledger.books[hi]
    ranked = state.victim_cache[(mi, hi)][1]
    assert ranked is not None, "a chosen host has a victim pool"
    freed = _freed_resource(state, hi, ranked[2])
    state.staged_binds.setdefault(mi, []).append((state.hosts[hi].host_id, freed))
    for v in chosen:
        vmi = state.ledger.index.get(v.model_id)
        if vmi is not None and vmi in book.models:
            state.ledger.remove(vmi, hi)
            if v.surplus:
                state.reclaimed.append((vmi, hi, p.model_id))
        why = "surplus" if v.surplus else "preemption"
        _evict(state, v.model_id, hi, p.model_id, p.priority, why)
        res = state.res_maps[hi].get(v.model_id)
        book.released_mb += res.memory_mb if res is not None else 0
    if any(v.surplus for v in chosen):
        # The model now holds one replica less: other hosts' pools may no longer offer its
        # replicas as surplus (never below what it needs, never its last ready replica).
        state.victim_cache.clear()
    # Released memory is proven free only later: the beneficiary is not assigned here in this
    # plan, but its footprint, slot and colocation rules are reserved so an unrelated model
    # that fits beside both may still be placed (Ledger.fit_new).
    book.blocked = True
    book.staged.add(p.model_id)
    staged_mb = state.ledger.memory(mi, hi)[1]
    book.staged_mb += staged_mb
    book.raw_free -= staged_mb
    book.version += 1
    state.staged[mi] = state.staged.get(mi, 0) + 1
    return True


def _freed_resource(state: PlanState, hi: int, need: VictimNeed) -> UnmetResource:
    """The resource a staged victim set on ``hi`` frees for its beneficiary, read from the
    ``need`` it was chosen for (before the victims leave the ledger): ``memory`` when it must
    release live or desired MB, else ``slots`` when the host's model-slot ceiling is full,
    else ``colocation`` (the beneficiary's own ceiling or an exclusion). When several bind,
    the first in that order names it, as :data:`grid_core.planner.report.FIT_ORDER` does.
    """
    book = state.ledger.books[hi]
    if need.memory_mb or need.desired_mb:
        return "memory"
    if book.max_models and len(book.present) + 1 > book.max_models:
        return "slots"
    return "colocation"


def surplus_hold(state: PlanState, vmi: int, hi: int, r: ResidencySnapshot) -> str | None:
    """Why the kept replica ``r`` of model ``vmi`` on host ``hi`` may not be reclaimed as
    surplus, or ``None`` when it may.

    A surplus replica is one beyond what its model's current demand needs
    (:meth:`PlanState.needed`, never below one): a burst that is over, or the scale-down
    cooldown, keeps it only for hysteresis. It is an idle, reclaimable victim for another
    model's direct demand once idle and past its minimum residency; never a pinned replica and
    never the model's last ready one (specification, "Global placement loop": failed, draining
    and idle victims first; "Safety invariants" 5 and 7).
    """
    ledger = state.ledger
    if ledger.count[vmi] <= max(1, state.needed(vmi)):
        return "needed"
    if _pinned_here(state, r.model_id, state.hosts[hi].host_id):
        return "pinned"
    if state.protected(vmi, r.loaded_at, r.state):
        return "min_residency"
    if r.active_requests is None:
        return "activity_unknown"
    if r.active_requests > 0:
        return "in_flight"
    if last_ready(state, vmi, r):
        return "last_ready_replica"
    return None


def _beneficiary_start_s(state: PlanState, mi: int, hi: int) -> float:
    """Seconds until ``mi`` could serve on ``hi`` once released (load + warm, or warm only
    when the exact weights are cached), from the learned per-host timings or the priors."""
    p, host = state.profiles[mi], state.hosts[hi]
    return startup_path_s(p, host.performance.get(p.model_id), state.ledger.cached(mi, hi))


def _cached_pool(state: PlanState, mi: int, hi: int) -> RankedPool | None:
    """(rank, candidates, need) for beneficiary ``mi`` on ``hi``, memoised per host version;
    ``None`` at once for a host without residencies (victims are residencies: most hosts of
    a fresh fleet)."""
    if not state.hosts[hi].residencies:
        return None
    version = state.ledger.books[hi].version
    got = state.victim_cache.get((mi, hi))
    if got is not None and got[0] == version:
        return got[1]
    pool = _victim_pool(state, mi, hi)
    ranked: RankedPool | None = None
    if pool is not None:
        cands, need = pool
        ranked = ((min(c.priority for c in cands), sum(c.disruption for c in cands)), cands, need)
    state.victim_cache[(mi, hi)] = (version, ranked, Unasked.UNASKED)
    return ranked


def _cached_choice(
    state: PlanState, mi: int, hi: int, select_victims: VictimSelector
) -> tuple[VictimCandidate, ...] | None:
    """The selector's validated answer for ``mi`` on ``hi`` (asked once per host version).

    Only called for a host whose pool :func:`_cached_pool` found (``ranked`` is set).
    """
    version, ranked, answer = state.victim_cache[(mi, hi)]
    if not isinstance(answer, Unasked):
        return answer
    assert ranked is not None, "asked only about hosts with a victim pool"
    _, cands, need = ranked
    ctx = VictimContext(
        host_id=state.hosts[hi].host_id,
        beneficiary=state.profiles[mi].model_id,
        beneficiary_priority=state.profiles[mi].priority,
    )
    answer_raw = select_victims(tuple(cands), need, ctx)
    chosen = tuple(answer_raw) if answer_raw else None
    if chosen is not None and (
        not all(c in cands for c in chosen) or not need.satisfied_by(chosen)
    ):
        chosen = None  # a selector that answers unsafely is ignored (fail closed)
    state.victim_cache[(mi, hi)] = (version, ranked, chosen)
    return chosen


def _serves_old_revision(state: PlanState, vmi: int, r: ResidencySnapshot) -> bool:
    """Whether ``r`` is a ready replica of another revision than model ``vmi``'s profile
    names while no replica of the profile's revision is ready anywhere: during a rollout the
    old revision is still the model's service, not obsolete work (the new one must be ready
    before the old one goes; specification, "Managed host actuator")."""
    profile = state.profiles[vmi]
    if r.state != "ready" or revision_matches(profile, r.artifact_sha256):
        return False
    return not any(
        (cur := res_map.get(profile.model_id)) is not None
        and cur.state == "ready"
        and revision_matches(profile, cur.artifact_sha256)
        for res_map in state.res_maps
    )


def _stranded_last(state: PlanState, vmi: int, hi: int, r: ResidencySnapshot) -> bool:
    """Whether ``r`` is a ready replica of model ``vmi`` that the plan does not count because
    ``hi`` is throttled and one of its requests would outlast the protection grace, while the
    model still wants replicas and the plan keeps no ready one elsewhere. Such a replica
    keeps serving until its replacement is ready (make-before-break,
    :func:`~grid_core.planner.core.serving_incumbents`); as a victim it is therefore still
    its model's last ready replica, not obsolete work."""
    return (
        r.state == "ready"
        and state.desired[vmi] > 0
        and outlasts_protection(
            state.hosts[hi], state.profiles[vmi], state.policy.throttled_fraction
        )
        and kept_ready(state, vmi) == 0
    )


def _victim_pool(
    state: PlanState, mi: int, hi: int
) -> tuple[list[VictimCandidate], VictimNeed] | None:
    """Removable residencies on ``hi`` for beneficiary ``mi`` and what they must release.

    Another model's last ready replica is left out while ``mi``'s scale-out shortfall has not
    yet persisted (:func:`~grid_core.planner.lastready.settling_scale_out`).
    """
    ledger, host, book = state.ledger, state.hosts[hi], state.ledger.books[hi]
    p = state.profiles[mi]
    if book.blocked or p.model_id in book.present or not book.eligible:
        return None
    cands: list[VictimCandidate] = []
    waiting: list[VictimCandidate] = []  # last ready replicas a fresh scale-out may not take
    settling = settling_scale_out(state, mi, hi)
    for r in host.residencies:
        if r.state not in MEMORY_STATES or not r.actuatable:
            continue
        if (r.model_id, host.host_id) in state.evicted:
            continue
        vmi = ledger.index.get(r.model_id)
        # The victim's model index when it is a kept replica of a configured model.
        kept = vmi if vmi is not None and vmi in book.models else None
        if _pinned_here(state, r.model_id, host.host_id):
            continue  # pinned work is never preempted on its pinned host
        prio = state.profiles[kept].priority if kept is not None else OBSOLETE_PRIORITY
        if (
            kept is None
            and vmi is not None
            and (_serves_old_revision(state, vmi, r) or _stranded_last(state, vmi, hi, r))
        ):
            # A rollout's old revision still serving its model, or the model's last ready
            # replica stranded on a throttled host: it yields only to what could preempt the
            # model itself (specification, "Safety invariants" 5 and 8).
            prio = state.profiles[vmi].priority
        elif (
            kept is None
            and vmi is not None
            and (vmi, hi) in state.off_pin
            and state.ledger.count[vmi] < state.desired[vmi]
        ):
            # Held back only because its model's pins take its room first, and the model is
            # still short: wanted work, not obsolete, so it yields only to higher priority
            # ("Safety invariants" 3). Once the model is satisfied it is surplus again.
            prio = state.profiles[vmi].priority
        surplus = kept is not None and surplus_hold(state, kept, hi, r) is None
        if surplus:
            prio = SURPLUS_PRIORITY
        if prio >= p.priority or state.protected(vmi, r.loaded_at, r.state):
            continue
        warm = 0.0
        if kept is not None:
            q = state.profiles[kept]
            # Learned per-host timings (controller-blended with the priors) price warm-back.
            warm = startup_path_s(q, host.performance.get(q.model_id), False)
        cand = VictimCandidate(
            model_id=r.model_id,
            host_id=host.host_id,
            memory_mb=r.memory_mb,
            desired_mb=book.models[kept].raw_mb if kept is not None else 0,
            priority=prio,
            state=r.state,
            idle=r.active_requests == 0,
            warm_back_s=warm,
            surplus=surplus,
        )
        if settling and kept is not None and last_ready(state, kept, r):
            waiting.append(cand)
        else:
            cands.append(cand)
    return _with_need(state, mi, hi, cands, waiting)


def _with_need(
    state: PlanState,
    mi: int,
    hi: int,
    cands: list[VictimCandidate],
    waiting: list[VictimCandidate],
) -> tuple[list[VictimCandidate], VictimNeed] | None:
    """``cands`` (best first, at most :data:`MAX_VICTIM_CANDIDATES`) and what they must
    release on ``hi`` for ``mi``, or ``None`` when they cannot release it.

    When only the ``waiting`` last ready replicas would have made the set sufficient, their
    models are noted in :attr:`PlanState.settling` (the beneficiary's unmet reason,
    :mod:`grid_core.planner.lastready`).
    """
    ledger, book, p = state.ledger, state.ledger.books[hi], state.profiles[mi]
    cands.sort(key=lambda c: (c.priority, c.disruption, c.warm_back_s, c.model_id))
    cands = cands[:MAX_VICTIM_CANDIDATES]
    _, mem = ledger.memory(mi, hi)
    present = book.present
    slots = max(0, len(present) + 1 - book.max_models) if book.max_models else 0
    own = ledger.ceiling.get(p.model_id, 0)
    if own:
        slots = max(slots, len(present) + 1 - own)
    required = tuple(sorted(ledger.excludes.get(p.model_id, set()) & present))
    need = VictimNeed(
        memory_mb=max(0, ledger.admit_mb(mi, hi) - book.inc_free),
        desired_mb=max(0, mem - book.raw_free),
        slots=slots,
        required=required,
    )
    if not cands or not need.satisfied_by(cands):
        if waiting and need.satisfied_by(cands + waiting):
            state.settling.setdefault(mi, set()).update(v.model_id for v in waiting)
        return None
    return cands, need
