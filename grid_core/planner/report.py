"""Unmet constraints: every shortfall of a plan, with a code and a message.

Source: specification, "Safety invariants" 10 (fail honestly: unmet replicas and policy
shortfalls stay visible; no invented capacity, no silently relaxed hard constraint).
"""

from __future__ import annotations

from grid_core.planner.core import PlanState
from grid_core.planner.eligibility import placement_incompatibility
from grid_core.planner.lastready import settling_message
from grid_core.planner.phases import surplus_hold
from grid_core.planner.types import SurplusReplica, Unmet, UnmetCode, UnmetResource
from grid_core.profile import ModelProfile

STATIC_RESOURCE: dict[str, UnmetResource] = {
    "runtime": "runtime",
    "backend": "runtime",
    "required_tags": "tags",
    "forbidden_tags": "tags",
    "data_tier": "tier",
    "gpu_count": "gpu",
    "gpu_memory": "gpu",
    "throttled": "eligibility",
}
"""Static incompatibility → the resource an operator would change (runtime, tags, ...)."""

FIT_CODES: dict[str, UnmetCode] = {
    "memory": "capacity_shortage",
    "slots": "slot_limit",
    "disk": "disk_shortage",
    "colocation": "colocation_conflict",
}
"""Binding dynamic resource → unmet code."""

FIT_ORDER: tuple[UnmetResource, ...] = ("memory", "slots", "disk", "colocation")
"""Tie-break between dynamic resources that block equally many hosts."""
STAGED_WORK: dict[UnmetResource, str] = {
    "memory": "free memory",
    "slots": "free a model slot",
    "disk": "free disk space",
    "colocation": "clear a colocation exclusion",
}
"""What a staged change does for the waiting replica, by the ``resource`` of its unmet row
(the words of its message; any other resource reads as freeing that resource)."""


def _staged_work(resource: UnmetResource) -> str:
    return STAGED_WORK.get(resource, f"free {resource}")


def unmet(state: PlanState) -> list[Unmet]:
    """Every shortfall; the ``missing`` of replica codes sums to needed minus placed.

    Needed is the desired count without the replicas only hysteresis holds
    (:meth:`PlanState.needed`): a held replica that no longer exists is not rebuilt, so its
    absence is no shortfall.

    Each entry names the binding resource (``resource``): for a replica shortfall the one
    whose relaxation alone would open the most compatible hosts (model slots, memory, disk,
    colocation), or the static rule that leaves too few compatible hosts (runtime, tags,
    tier, gpu); ``domain`` for a failure-domain shortfall and ``pin`` for a pin whose host
    cannot take its replica.
    """
    out: list[Unmet] = []
    for mi, p in enumerate(state.profiles):
        missing = state.needed(mi) - state.ledger.count[mi]
        if missing > 0:
            out.extend(_replica_unmet(state, mi, missing))
        if p.pins:
            out.extend(_pin_unmet(state, mi))
        need = state.required_domains(mi)
        have = len(state.ledger.domains[mi])
        if state.ledger.count[mi] and have < need:
            out.append(
                Unmet(
                    code="failure_domain_shortfall",
                    model_id=p.model_id,
                    resource="domain",
                    missing=need - have,
                    message=f"model '{p.model_id}' spans {have} failure domain(s), "
                    f"needs {need}; add capacity in other domains or lower "
                    "min_failure_domains",
                )
            )
    return out


def _replica_unmet(state: PlanState, mi: int, missing: int) -> list[Unmet]:
    p = state.profiles[mi]
    out: list[Unmet] = []
    staged = min(missing, state.staged.get(mi, 0))
    if staged:
        freed = _commonest([r for _, r in state.staged_binds.get(mi, [])])
        out.append(
            Unmet(
                code="preemption_staged",
                model_id=p.model_id,
                resource=freed,
                missing=staged,
                message=f"model '{p.model_id}': {staged} replica(s) wait for staged "
                f"evictions to {_staged_work(freed)} (placed after a later heartbeat "
                "shows the evicted replicas gone)",
            )
        )
    rest = missing - staged
    if rest > 0 and mi in state.relocations:
        moved, src, dst = state.relocations[mi]
        out.append(
            Unmet(
                code="relocation_staged",
                model_id=p.model_id,
                resource=state.relocation_binds.get(mi, "memory"),
                host_id=src,
                missing=1,
                message=f"model '{p.model_id}': '{moved}' moves from '{src}' to "
                f"'{dst}' first; this replica is placed on '{src}' once the "
                "old copy is unloaded",
            )
        )
        rest -= 1
    if rest <= 0:
        return out
    code, resource, why = binding(state, mi)
    if mi in state.budget_hit:
        code = "eviction_budget"
        why = f"the per-plan eviction budget is spent ({why}); later plans continue"
    elif mi in state.settling:
        code = "shortfall_settling"
        why = f"{settling_message(state, mi)} ({why})"
    out.append(
        Unmet(
            code=code,
            model_id=p.model_id,
            resource=resource,
            missing=rest,
            message=f"model '{p.model_id}': {rest} of {state.reported[mi]} desired "
            f"replica(s) unplaced: {why}",
        )
    )
    return out


def _commonest(freed: list[UnmetResource]) -> UnmetResource:
    """The resource most of a model's staged preemptions free (ties in :data:`FIT_ORDER`);
    ``memory`` for none, as the staged-change messages say."""
    if not freed:
        return "memory"
    return max(FIT_ORDER, key=lambda r: (freed.count(r), -FIT_ORDER.index(r)))


def binding(state: PlanState, mi: int) -> tuple[UnmetCode, UnmetResource, str]:
    """(code, binding resource, explanation) for a model that is still short.

    Every compatible host without a replica of the model is classified by which dynamic
    resources it lacks now (memory, model slots, disk, colocation). The binding resource
    is the one that alone blocks the most hosts (relaxing it would open them); when every
    host lacks several, the one lacking on the most hosts. When no compatible host is left
    at all, the static rule that excludes the most eligible hosts binds.
    """
    ledger = state.ledger
    p = state.profiles[mi]
    mid = p.model_id
    alone = dict.fromkeys(FIT_ORDER, 0)
    anywhere = dict.fromkeys(FIT_ORDER, 0)
    staged = 0
    open_hosts = 0
    for hi in state.cands[mi]:
        book = ledger.books[hi]
        if mid in book.present:
            continue
        open_hosts += 1
        if book.blocked:
            staged += 1
            continue
        lacks = _lacks(state, mi, hi)
        for r in lacks:
            anywhere[r] += 1
        if len(lacks) == 1:
            alone[lacks[0]] += 1
    if open_hosts == 0:
        return _static_binding(state, mi)
    if not any(anywhere.values()):
        return (
            "capacity_shortage",
            "memory",
            f"its {staged} open compatible host(s) wait for staged changes",
        )
    score = {r: (alone[r], anywhere[r], -FIT_ORDER.index(r)) for r in FIT_ORDER}
    resource = max(FIT_ORDER, key=lambda r: score[r])
    names = {"memory": "memory", "slots": "model slots", "disk": "disk", "colocation": "colocation"}
    parts = [f"{names[r]} on {anywhere[r]}" for r in FIT_ORDER if anywhere[r]]
    why = (
        f"{names[resource]} binds: of {open_hosts} compatible host(s) without a replica, "
        f"{alone[resource]} lack only {names[resource]} (lacking: {', '.join(parts)})"
    )
    return FIT_CODES[resource], resource, why


def _lacks(state: PlanState, mi: int, hi: int) -> list[UnmetResource]:
    """Dynamic resources host ``hi`` lacks for one more replica of ``mi`` right now."""
    ledger = state.ledger
    book = ledger.books[hi]
    mid = state.profiles[mi].model_id
    out: list[UnmetResource] = []
    mem = state.mem_rows[mi][hi]
    if book.inc_free < ledger.admit_mb(mi, hi) or book.raw_free < mem:
        out.append("memory")
    if book.max_models and len(book.present) + 1 > book.max_models:
        out.append("slots")
    disk = ledger.disk_cost(mi, hi)
    if disk and book.disk_free is not None and book.disk_free < disk:
        out.append("disk")
    if (ledger.ceiling or ledger.excludes.get(mid)) and ledger.colocation_conflict(
        mid, book.present
    ):
        out.append("colocation")
    return out


def _rule_values(p: ModelProfile, resource: UnmetResource) -> str:
    """What the profile asks for under ``resource``, e.g. `` (runtime vllm)``, so that the
    unmet message names the value an operator would check or change."""
    wants: list[str] = []
    if resource == "runtime":
        wants = [f"runtime {'/'.join(p.runtimes)}"]
        if p.backends:
            wants.append(f"backend {'/'.join(p.backends)}")
    elif resource == "tags":
        wants = [f"tag {t}" for t in p.required_tags]
        wants += [f"not tag {t}" for t in p.forbidden_tags]
    elif resource == "gpu":
        wants = [f"{p.min_gpu_count} GPU(s)"] if p.min_gpu_count else []
        if p.min_gpu_memory_mb:
            wants.append(f"{p.min_gpu_memory_mb} MB per GPU")
    elif resource == "tier" and p.data_tier:
        wants = [f"data tier {p.data_tier}"]
    return f" ({', '.join(wants)})" if wants else ""


def _static_binding(state: PlanState, mi: int) -> tuple[UnmetCode, UnmetResource, str]:
    """Every compatible host is used (or none exists): which static rule binds."""
    p = state.profiles[mi]
    counts: dict[UnmetResource, int] = {}
    eligible = throttled = 0
    for hi, host in enumerate(state.hosts):
        if not state.ledger.books[hi].eligible:
            continue
        eligible += 1
        bad = placement_incompatibility(p, host, state.policy.throttled_fraction)
        if bad == "throttled":
            throttled += 1
        if bad is not None:
            r = STATIC_RESOURCE.get(bad, "eligibility")
            counts[r] = counts.get(r, 0) + 1
    n = len(state.cands[mi])
    resource: UnmetResource
    if not counts:
        resource = "eligibility"
        detail = f"{eligible} host(s) are eligible for new work"
    else:
        resource = max(sorted(counts), key=lambda r: counts[r])
        detail = (
            f"its {resource} rule{_rule_values(p, resource)} excludes {counts[resource]} of "
            f"{eligible} eligible host(s)"
        )
        if resource == "eligibility" and throttled:
            detail = (
                f"{throttled} of {eligible} eligible host(s) are throttled and one of its "
                "requests would outlast their protection grace"
            )
    if n == 0:
        return "no_eligible_host", resource, f"no eligible host is compatible ({detail})"
    return (
        "host_shortage",
        resource,
        f"all {n} compatible host(s) already run a replica, one per host ({detail})",
    )


def _pin_unmet(state: PlanState, mi: int) -> list[Unmet]:
    """Pins whose host holds no replica and has no staged change for it.

    A pin is a floor: when its host cannot take the replica the model is planned towards
    what its demand alone asks for; the replicas that this leaves out are counted here
    (``missing``), a pin whose replica the demand places elsewhere counts 0.
    """
    p = state.profiles[mi]
    ledger = state.ledger
    by_id = {h.host_id: hi for hi, h in enumerate(state.hosts)}
    staged_hosts = {e.host_id for e in state.evictions if e.beneficiary == p.model_id}
    reloc_host = state.relocations.get(mi, ("", "", ""))[1]
    left = state.reported[mi] - state.desired[mi]
    short = state.needed(mi) - ledger.count[mi] > 0
    out: list[Unmet] = []
    for pin in p.pins:
        hi = by_id.get(pin)
        if hi is not None and mi in ledger.books[hi].models:
            continue
        if pin in staged_hosts or pin == reloc_host:
            if not short:  # the shortfall, which names staged changes, is empty
                out.append(_pin_waits(state, mi, pin, pin in staged_hosts))
            continue  # reported with the replica shortfall (preemption/relocation staged)
        if hi is None:
            why = "the host is not registered"
        elif ledger.ineligible[hi] is not None:
            why = f"the host is ineligible ({ledger.ineligible[hi]})"
        elif (
            bad := placement_incompatibility(p, state.hosts[hi], state.policy.throttled_fraction)
        ) is not None:
            why = f"the host is incompatible ({bad})"
        else:
            lacks = ", ".join(_lacks(state, mi, hi)) or "capacity"
            why = f"the host lacks {lacks} and holds nothing that may be preempted"
        count = 1 if left > 0 else 0
        left -= count
        out.append(
            Unmet(
                code="pin_unavailable",
                model_id=p.model_id,
                resource="pin",
                host_id=pin,
                missing=count,
                message=f"model '{p.model_id}' is pinned to '{pin}' but {why}; the pin is "
                "never moved to another host"
                + ("" if count else " (its demand is placed on other hosts)"),
            )
        )
    return out


def _pin_waits(state: PlanState, mi: int, pin: str, evicting: bool) -> Unmet:
    """A pin whose host waits for a staged change while the model's demand is already met
    on other hosts: no replica is missing, but the pin is not yet held (the plan says why).
    Its resource is what the change frees on the pin's host."""
    model_id = state.profiles[mi].model_id
    change = "staged evictions" if evicting else "a staged relocation"
    if evicting:
        resource = _commonest([r for h, r in state.staged_binds.get(mi, []) if h == pin])
    else:
        resource = state.relocation_binds.get(mi, "memory")
    return Unmet(
        code="preemption_staged" if evicting else "relocation_staged",
        model_id=model_id,
        resource=resource,
        host_id=pin,
        missing=0,
        message=f"model '{model_id}' is pinned to '{pin}', which waits for {change} to "
        f"{_staged_work(resource)} there (its demand is placed on other hosts meanwhile)",
    )


def surplus_report(state: PlanState) -> list[SurplusReplica]:
    """Replicas of every model that holds more than current demand needs: the ones staged for
    reclaim (with their beneficiary) and the kept ones with the reason each was not taken.

    Ordered by model id, then host id.
    """
    out: list[SurplusReplica] = []
    reclaimed = {(vmi, hi): who for vmi, hi, who in state.reclaimed}
    for mi, p in enumerate(state.profiles):
        needed = state.needed(mi)
        held_here = state.ledger.count[mi] + sum(1 for vmi, _ in reclaimed if vmi == mi)
        if held_here <= max(1, needed):
            continue
        for hi, host in enumerate(state.hosts):
            who = reclaimed.get((mi, hi))
            if who is not None:
                out.append(
                    SurplusReplica(
                        model_id=p.model_id,
                        host_id=host.host_id,
                        decision="reclaimed",
                        reason="direct_demand",
                        beneficiary=who,
                        needed=needed,
                    )
                )
                continue
            placed = state.ledger.books[hi].models.get(mi)
            res = state.res_maps[hi].get(p.model_id)
            if placed is None or not placed.incumbent or res is None:
                continue
            why = surplus_hold(state, mi, hi, res)
            out.append(
                SurplusReplica(
                    model_id=p.model_id,
                    host_id=host.host_id,
                    decision="kept",
                    reason="no_claimant" if why is None else why,
                    needed=needed,
                )
            )
    return out
