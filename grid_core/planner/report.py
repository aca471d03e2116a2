"""Unmet constraints: every shortfall of a plan, with a code and a message.

Source: specification, "Safety invariants" 10 (fail honestly: unmet replicas and policy
shortfalls stay visible; no invented capacity, no silently relaxed hard constraint).
"""

from __future__ import annotations

from grid_core.planner.core import PlanState
from grid_core.planner.eligibility import incompatibility
from grid_core.planner.types import Unmet, UnmetCode

REASON_CODES: tuple[tuple[str, UnmetCode], ...] = (
    ("memory", "capacity_shortage"),
    ("slots", "slot_limit"),
    ("colocation", "colocation_conflict"),
    ("disk", "disk_shortage"),
)
"""Fit failure → unmet code, most fundamental first (memory explains most shortfalls)."""


def unmet(state: PlanState) -> list[Unmet]:
    """Every shortfall; the ``missing`` of replica codes sums to desired minus placed."""
    out: list[Unmet] = []
    for mi, p in enumerate(state.profiles):
        missing = state.desired[mi] - state.ledger.count[mi]
        if missing > 0:
            out.extend(_pin_unmet(state, mi) if p.pins else _replica_unmet(state, mi, missing))
        need = state.required_domains(mi)
        have = len(state.ledger.domains[mi])
        if state.ledger.count[mi] and have < need:
            out.append(
                Unmet(
                    code="failure_domain_shortfall",
                    model_id=p.model_id,
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
        out.append(
            Unmet(
                code="preemption_staged",
                model_id=p.model_id,
                missing=staged,
                message=f"model '{p.model_id}': {staged} replica(s) wait for staged "
                "evictions to free memory (placed after a later heartbeat "
                "proves it free)",
            )
        )
    rest = missing - staged
    if rest > 0 and mi in state.relocations:
        moved, src, dst = state.relocations[mi]
        out.append(
            Unmet(
                code="relocation_staged",
                model_id=p.model_id,
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
    if mi in state.budget_hit:
        code: UnmetCode = "eviction_budget"
        why = "the per-plan eviction budget is spent; later plans continue"
    elif not state.cands[mi]:
        code, why = (
            "no_eligible_host",
            "no eligible host passes its runtime, backend, tier, tag and GPU rules",
        )
    else:
        reasons = state.fail_reasons[mi]
        code, why = "capacity_shortage", "compatible hosts lack free memory"
        for key, c in REASON_CODES:
            if key in reasons:
                code, why = c, f"compatible hosts are blocked by {key}"
                break
    out.append(
        Unmet(
            code=code,
            model_id=p.model_id,
            missing=rest,
            message=f"model '{p.model_id}': {rest} of {state.desired[mi]} desired "
            f"replica(s) unplaced: {why}",
        )
    )
    return out


def _pin_unmet(state: PlanState, mi: int) -> list[Unmet]:
    p = state.profiles[mi]
    ledger = state.ledger
    by_id = {h.host_id: hi for hi, h in enumerate(state.hosts)}
    held = {
        state.hosts[hi].host_id for hi in range(len(state.hosts)) if mi in ledger.books[hi].models
    }
    out: list[Unmet] = []
    staged_hosts = {e.host_id for e in state.evictions if e.beneficiary == p.model_id}
    for pin in p.pins:
        if pin in held:
            continue
        hi = by_id.get(pin)
        if hi is None:
            why = "the host is not registered"
        elif ledger.ineligible[hi] is not None:
            why = f"the host is ineligible ({ledger.ineligible[hi]})"
        elif (bad := incompatibility(p, state.hosts[hi])) is not None:
            why = f"the host is incompatible ({bad})"
        elif pin in staged_hosts:
            out.append(
                Unmet(
                    code="preemption_staged",
                    model_id=p.model_id,
                    host_id=pin,
                    missing=1,
                    message=f"model '{p.model_id}' pinned to '{pin}' "
                    "waits for staged evictions there",
                )
            )
            continue
        elif state.relocations.get(mi, ("", "", ""))[1] == pin:
            moved, _, dst = state.relocations[mi]
            out.append(
                Unmet(
                    code="relocation_staged",
                    model_id=p.model_id,
                    host_id=pin,
                    missing=1,
                    message=f"model '{p.model_id}' pinned to '{pin}' "
                    f"waits for '{moved}' to move to '{dst}'",
                )
            )
            continue
        else:
            why = f"the host lacks room ({ledger.fit_new(mi, hi) or 'capacity'})"
        out.append(
            Unmet(
                code="pin_unavailable",
                model_id=p.model_id,
                host_id=pin,
                missing=1,
                message=f"model '{p.model_id}' is pinned to '{pin}' but {why}; it is "
                "never moved to another host",
            )
        )
    return out
