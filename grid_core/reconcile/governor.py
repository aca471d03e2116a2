"""The mutation governor: which proposals start now, in which order, and which wait.

Specification, "Safety invariants" 8 and "Reconciliation and modes": global and per-host
concurrent-mutation limits, an exact-artifact load fanout limit, availability before routine
cleanup, higher priority first (a preemption drain carries its beneficiary's priority), then
required baseline before direct demand before predictive prewarming, one replica round per
model, and the shortest remaining cold-start path. A higher class may take the slot of a
lower-class constructive action only while that action has never been delivered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from grid_core.reconcile.actions import Action
from grid_core.reconcile.policy import GovernorPolicy
from grid_core.reconcile.reconciler import Deferred, Proposal

CLASS_RANK = {"baseline": 0, "direct": 1, "predictive": 2, "cleanup": 3}
"""Lower ranks are served first within one priority."""


def service_key(p: Proposal) -> tuple[int, int, int, int, int, int, float, str, str]:
    """Sort key giving the service order of proposals.

    Routine cleanup sorts after every availability action whatever its priority; otherwise
    higher priority first, then class, replica round (a preemption carries its
    beneficiary's), then the preemption group with the fewest transitions left (a release
    that completes sooner lets its beneficiary serve sooner), cold-start path, and ids last
    so the order is deterministic. Among equal destructive work, releasing already-drained
    capacity (unload, evict) comes before starting a new drain, so a preemption wave frees
    memory that is ready to go before it disturbs live work.
    """
    cleanup = 1 if p.service_class == "cleanup" else 0
    release_first = 1 if p.kind == "drain" else 0
    return (
        cleanup,
        -p.priority,
        CLASS_RANK[p.service_class],
        p.round,
        p.group_left,
        release_first,
        p.cold_path_s,
        p.model_id,
        p.host_id,
    )


def rank_of(a: Action) -> tuple[int, int, int]:
    """Service rank of a recorded action (lower is served first)."""
    cleanup = 1 if a.service_class == "cleanup" else 0
    return (cleanup, -a.priority, CLASS_RANK.get(a.service_class, 1))


def _artifact(model_id: str, sha: str | None) -> str:
    return sha or f"model:{model_id}"


@dataclass
class Admission:
    """The governor's decision for one tick.

    Attributes:
        admitted: proposals to issue now, in service order.
        deferred: proposals that wait, with the bound that stopped them.
        preempted: ids of undelivered lower-class constructive actions to withdraw so a
            higher class can use their slot.
    """

    admitted: list[Proposal] = field(default_factory=list)
    deferred: list[Deferred] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)


def _slot_holders(actions: Iterable[Action]) -> list[Action]:
    """Actions that occupy a mutation slot: active ones, and closed ones that may still run.

    A load and its dependent warm are one replica lifecycle and hold one slot (the warm).
    """
    holders: dict[tuple[str, str], Action] = {}
    for a in actions:
        if not (a.active or a.maybe_running):
            continue
        key = (a.host_id, a.model_id)
        if key not in holders or a.kind == "warm":
            holders[key] = a
    return list(holders.values())


def admit(
    proposals: list[Proposal],
    actions: Iterable[Action],
    free_mb: dict[str, int],
    policy: GovernorPolicy,
) -> Admission:
    """Admit a service-ordered prefix of ``proposals`` within every bound.

    Args:
        proposals: wanted actions (any order; sorted here by :func:`service_key`).
        actions: every recorded action (slots, fanout and withdrawal candidates).
        free_mb: host id → MB free for new warms; reduced here as warms are admitted so two
            warms can never claim the same memory.
        policy: the bounds.

    Returns:
        The admission decision.
    """
    out = Admission()
    actions = list(actions)
    holders = _slot_holders(actions)
    global_used = len(holders)
    host_used: Counter[str] = Counter(a.host_id for a in holders)
    fanout: Counter[str] = Counter(
        _artifact(a.model_id, a.artifact_sha256)
        for a in actions
        if a.kind == "load" and (a.active or a.maybe_running)
    )
    displaceable = _displaceable(actions, holders)
    free = dict(free_mb)

    def defer(p: Proposal, reason: str) -> None:
        out.deferred.append(
            Deferred(kind=p.kind, host_id=p.host_id, model_id=p.model_id, reason=reason)
        )

    for p in sorted(proposals, key=service_key):
        if p.kind == "warm" and p.memory_mb > free.get(p.host_id, 0):
            defer(p, "awaiting_memory")
            continue
        art = _artifact(p.model_id, p.artifact_sha256)
        loads = p.load_first or p.kind == "load"
        if loads and fanout[art] >= policy.artifact_fanout:
            defer(p, "artifact_fanout")
            continue
        host_full = host_used[p.host_id] >= policy.max_host_mutations
        global_full = global_used >= policy.max_global_mutations
        if host_full or global_full:
            victim = _displace(p, displaceable, host_full)
            if victim is None:
                defer(p, "host_mutation_limit" if host_full else "global_mutation_limit")
                continue
            displaceable.remove(victim)
            out.preempted.extend(
                a.action_id
                for a in actions
                if a.active
                and not a.delivered
                and (a.host_id, a.model_id) == (victim.host_id, victim.model_id)
                and not a.destructive
            )
            host_used[victim.host_id] -= 1
            global_used -= 1
            if victim.kind == "warm":
                free[victim.host_id] = free.get(victim.host_id, 0) + victim.memory_mb
        out.admitted.append(p)
        host_used[p.host_id] += 1
        global_used += 1
        if loads:
            fanout[art] += 1
        if p.kind == "warm":
            free[p.host_id] = free.get(p.host_id, 0) - p.memory_mb
    return out


def _displaceable(actions: list[Action], holders: list[Action]) -> list[Action]:
    """Slot holders a higher service class may displace, lowest service class first.

    Only undelivered constructive holders qualify, and only when no member of their
    lifecycle was delivered (a delivered load may be running: it is never cancelled, and it
    would keep the slot anyway). Among equal ranks the leaf that discards no prerequisite
    work (a warm of cached weights) gives way first.
    """
    delivered_pairs = {
        (a.host_id, a.model_id) for a in actions if a.active and a.delivered and not a.destructive
    }
    with_load = {(a.host_id, a.model_id) for a in actions if a.active and a.kind == "load"}
    return sorted(
        (
            a
            for a in holders
            if a.active
            and not a.delivered
            and not a.destructive
            and (a.host_id, a.model_id) not in delivered_pairs
        ),
        key=lambda a: (rank_of(a), (a.host_id, a.model_id) not in with_load),
        reverse=True,
    )


def _displace(p: Proposal, candidates: list[Action], host_full: bool) -> Action | None:
    """The lowest-class undelivered constructive holder ``p`` strictly outranks, if any."""
    if p.service_class == "cleanup" or p.kind not in ("load", "warm"):
        return None
    mine = (0, -p.priority, CLASS_RANK[p.service_class])
    for a in candidates:  # lowest class first
        if rank_of(a) <= mine:
            return None
        if host_full and a.host_id != p.host_id:
            continue  # only a holder on the same host frees the host slot
        return a
    return None
