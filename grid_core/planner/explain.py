"""Why a model is where it is: one plan replayed host by host for one model.

Source: specification, "Safety invariants" 10 (shortfalls stay visible with their cause) and
"Global placement loop" (eligibility, hard compatibility rules, memory, slots, colocation and
disk decide where a replica may go). The explanation is computed from the same ledger the
planner uses: the plan's assignments are replayed into a fresh ledger, then every host that
did not receive the model is asked why a new replica would not fit there now.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from grid_core.demand.types import ModelDemand
from grid_core.planner.eligibility import placement_incompatibility
from grid_core.planner.ledger import Ledger
from grid_core.planner.types import Plan, PlannerPolicy, Unmet
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

Verdict = Literal["kept", "placed", "ineligible", "incompatible", "rejected", "fits"]
"""kept/placed: the plan holds a replica there; ineligible: the host takes no new work;
incompatible: a static rule excludes it; rejected: it lacks room now; fits: it could take a
replica but the plan needs none there."""

PROTECTION_STATES = frozenset({"draining", "paused", "unhealthy", "quarantined"})
"""Host lifecycle states set by the local protection loop that refuse new work."""

UNMET_BINDING: dict[str, str] = {
    "host_shortage": "eligibility",
    "no_eligible_host": "eligibility",
    "capacity_shortage": "memory",
    "slot_limit": "slots",
    "disk_shortage": "disk",
    "colocation_conflict": "colocation",
    "pin_unavailable": "pin",
    "failure_domain_shortfall": "domain",
    "preemption_staged": "memory",
    "relocation_staged": "memory",
    "eviction_budget": "eviction_budget",
    "shortfall_settling": "memory",
}
"""Unmet code → binding resource, for a plan whose shortfall names none (plans from versions
that left staged changes without one); the planner's own ``Unmet.resource`` wins when set."""


class HostVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """One host as seen for one model.

    Attributes:
        host_id: the host.
        verdict: see :data:`Verdict`.
        reason: machine-stable cause (``state:paused``, ``memory``, ``slots``, ``pins`` …).
        detail: one readable sentence.
        free_mb: memory a new replica could still use on the host after the plan (MB).
    """

    host_id: str
    verdict: Verdict
    reason: str
    detail: str
    free_mb: int | None = None


class Explanation(msgspec.Struct, frozen=True, kw_only=True):
    """Why ``model_id`` has the replicas it has (or lacks).

    Attributes:
        model_id: the model.
        configured: a profile exists.
        desired: replicas the plan wants.
        placed: replicas the plan placed.
        demand: the forecast that set ``desired`` (``None`` without one).
        hosts: one verdict per known host, placed first.
        unmet: the plan's shortfalls for this model.
        binding: the constraint that limits placement (``memory``, ``slots``, ``disk``, ``pin``,
            ``protection``, ``runtime``, ``tags`` …), or ``None`` when nothing is unmet.
        summary: one readable sentence.
    """

    model_id: str
    configured: bool
    desired: int
    placed: int
    demand: ModelDemand | None
    hosts: list[HostVerdict]
    unmet: list[Unmet]
    binding: str | None
    summary: str


def explain(
    model_id: str,
    profiles: list[ModelProfile],
    hosts: list[HostSnapshot],
    plan: Plan | None,
    demand: ModelDemand | None,
    policy: PlannerPolicy,
) -> Explanation:
    """Explain one model's placement in ``plan`` over ``hosts``.

    Args:
        model_id: the model to explain.
        profiles: every configured profile (the plan's model set).
        hosts: the host snapshots the plan was made from.
        plan: the latest plan (``None`` before the first pass).
        demand: the model's forecast, if any.
        policy: the planner policy the plan used.

    Returns:
        The explanation; a model without a profile gets ``configured=False`` and no hosts.
    """
    profs = sorted(profiles, key=lambda p: p.model_id)
    hs = sorted(hosts, key=lambda h: h.host_id)
    index = {p.model_id: i for i, p in enumerate(profs)}
    if model_id not in index:
        return Explanation(
            model_id=model_id,
            configured=False,
            desired=0,
            placed=0,
            demand=None,
            hosts=[],
            unmet=[],
            binding="profile",
            summary=f"'{model_id}' has no profile: Grid never places it; create one with "
            "'grid allocator model set'",
        )
    ledger = Ledger(profs, hs, policy)
    host_index = {h.host_id: i for i, h in enumerate(hs)}
    assigned: dict[str, str] = {}
    incumbents: set[str] = set()
    for a in plan.assignments if plan is not None else ():
        mi, hi = index.get(a.model_id), host_index.get(a.host_id)
        if mi is None or hi is None:
            continue
        res = hs[hi].residency(a.model_id)
        if a.incumbent and res is not None:
            ledger.keep(mi, hi, res, a.reason)
        else:
            ledger.place(mi, hi, a.reason, a.score)
        if a.model_id == model_id:
            assigned[a.host_id] = a.reason
            if a.incumbent:
                incumbents.add(a.host_id)
    mi = index[model_id]
    profile = profs[mi]
    verdicts = [
        _verdict(ledger, profile, mi, hi, h, assigned, incumbents) for hi, h in enumerate(hs)
    ]
    order = {"kept": 0, "placed": 1, "fits": 2, "rejected": 3, "incompatible": 4, "ineligible": 5}
    verdicts.sort(key=lambda v: (order[v.verdict], v.host_id))
    unmet = [u for u in (plan.unmet if plan is not None else ()) if u.model_id == model_id]
    desired = plan.desired.get(model_id, 0) if plan is not None else 0
    binding = _binding(unmet, verdicts)
    return Explanation(
        model_id=model_id,
        configured=True,
        desired=desired,
        placed=len(assigned),
        demand=demand,
        hosts=verdicts,
        unmet=unmet,
        binding=binding,
        summary=_summary(model_id, desired, len(assigned), binding, unmet, verdicts, plan),
    )


def _verdict(
    ledger: Ledger,
    profile: ModelProfile,
    mi: int,
    hi: int,
    host: HostSnapshot,
    assigned: dict[str, str],
    incumbents: set[str],
) -> HostVerdict:
    hid = host.host_id
    free = min(ledger.books[hi].inc_free, ledger.books[hi].raw_free)
    if hid in assigned:
        kind: Verdict = "kept" if hid in incumbents else "placed"
        what = "keeps its replica" if kind == "kept" else "receives a new replica"
        return HostVerdict(
            host_id=hid,
            verdict=kind,
            reason=assigned[hid],
            detail=f"{what} ({assigned[hid]})",
            free_mb=free,
        )
    why = ledger.ineligible[hi]
    if why is not None:
        if why.startswith("state:") and why[6:] in PROTECTION_STATES:
            detail = f"its protection state is '{why[6:]}': it takes no new work"
        else:
            detail = f"it takes no new work ({why})"
        return HostVerdict(host_id=hid, verdict="ineligible", reason=why, detail=detail)
    bad = placement_incompatibility(profile, host, ledger.policy.throttled_fraction)
    if bad == "throttled":
        detail = "it is throttled and one request of this model would outlast its protection grace"
        return HostVerdict(host_id=hid, verdict="incompatible", reason=bad, detail=detail)
    if bad is not None:
        detail = f"it breaks the model's {bad.replace('_', ' ')} rule"
        return HostVerdict(host_id=hid, verdict="incompatible", reason=bad, detail=detail)
    fit = ledger.fit_new(mi, hi)
    if fit is None:
        return HostVerdict(
            host_id=hid,
            verdict="fits",
            reason="not_needed",
            detail="a replica would fit, but the plan needs none here",
            free_mb=free,
        )
    need = ledger.memory(mi, hi)[1]
    book = ledger.books[hi]
    floor = max(0, ledger.policy.admission_headroom_mb)
    headroom = ledger.admit_mb(mi, hi) - need + floor
    if book.raw_free < need:
        memory = (
            f"needs {need} MB, {max(0, book.raw_free)} MB allocatable left after the plan "
            f"({free} MB of it free for a new replica once the admission headroom is kept: "
            "the 'free after plan' figure)"
        )
    else:
        memory = (
            f"needs {need} MB and must leave {headroom} MB admission headroom, "
            f"{max(0, book.inc_free + floor)} MB free for new work after the plan"
        )
    details = {
        "memory": memory,
        "slots": f"all {host.max_models} model slot(s) are taken",
        "colocation": "a colocation rule forbids it next to the models there",
        "disk": "not enough free artifact disk for the weights",
        "blocked": "a withdrawn destructive action there waits for its receipt",
        "present": "the model is already present there (not as a desired replica)",
    }
    pinned = "its pinned host: " if hid in profile.pins else ""
    return HostVerdict(
        host_id=hid,
        verdict="rejected",
        reason=fit,
        detail=pinned + details.get(fit, fit),
        free_mb=free,
    )


def _binding(unmet: list[Unmet], verdicts: list[HostVerdict]) -> str | None:
    """The planner's binding resource for the first shortfall, made specific.

    ``eligibility`` (no host takes new work) becomes ``protection`` when the hosts that refuse
    are held back by their protection state (draining, paused, unhealthy, quarantined).
    """
    if not unmet:
        return None
    u = unmet[0]
    if u.resource is None:
        # A plan from a version that named no resource for staged changes: the hosts' own
        # refusals do.
        refusals = sorted(v.reason for v in verdicts if v.verdict == "rejected")
        if refusals:
            return max(refusals, key=refusals.count)
    resource = u.resource or UNMET_BINDING.get(u.code)
    if resource not in (None, "eligibility"):
        return resource
    refused = [v for v in verdicts if v.verdict == "ineligible"]
    protected = [v for v in refused if v.reason.removeprefix("state:") in PROTECTION_STATES]
    if refused and len(protected) * 2 >= len(refused):
        return "protection"
    return resource or "eligibility"


def _summary(
    model_id: str,
    desired: int,
    placed: int,
    binding: str | None,
    unmet: list[Unmet],
    verdicts: list[HostVerdict],
    plan: Plan | None,
) -> str:
    if plan is None:
        return f"'{model_id}': no plan yet (the controller has not run a pass)"
    where = ", ".join(v.host_id for v in verdicts if v.verdict in ("kept", "placed")) or "nowhere"
    head = f"'{model_id}': {placed} of {desired} desired replica(s) placed ({where})"
    if binding is None:
        return head
    missing = sum(u.missing for u in unmet)
    short = f"{missing} unplaced, " if missing else ""
    return f"{head}; {short}bound by {binding}: {unmet[0].message}"
