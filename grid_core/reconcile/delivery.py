"""Command selection and the final destructive revalidation for one heartbeat poll.

Specification, "Local wire contract": availability commands may ride any successful tick at
or after the poll's causal revision; a drain or unload needs the exact current safety
revision and, after its delivery marker is durably prepared, a final check against a fresh
registry snapshot in which every replacement route has strictly more than the lease margin
left. One unsafe member removes the model's whole destructive batch from the response.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from grid_core.planner.types import Plan
from grid_core.profile import ModelProfile
from grid_core.reconcile.actions import Action
from grid_core.reconcile.governor import rank_of
from grid_core.reconcile.policy import DRAIN_DEADLINE_REASON, GovernorPolicy
from grid_core.reconcile.reconciler import DRAINABLE_STATES, required_replicas
from grid_core.reconcile.view import admitting, reachable, releases_freely, replacement_problem
from grid_core.snapshot import HostSnapshot


def select(
    actions: Iterable[Action],
    host: HostSnapshot | None,
    now: float,
    policy: GovernorPolicy,
    *,
    availability_ok: bool,
    destructive_ok: bool,
    blocked_models: frozenset[str],
) -> list[Action]:
    """Active actions of one host that may ride this response, in service order.

    Args:
        actions: active actions of the host.
        host: its fresh snapshot (``None``: unknown host, nothing is selected).
        now: wall-clock seconds.
        policy: governor bounds (freshness).
        availability_ok: the last successful tick covers the poll's causal revision.
        destructive_ok: that tick saw the current safety revision and no hold is in force.
        blocked_models: models whose destructive work waits for a withdrawn batch.

    Returns:
        Actions in service order: priority and class first, then creation order.
    """
    if host is None or not reachable(host, policy):
        return []
    out: list[Action] = []
    # Service class first (a higher class queued later still goes first), FIFO within it.
    for a in sorted(actions, key=lambda a: (rank_of(a), a.order, a.created_at)):
        if not a.active or a.not_before > now:
            continue
        if a.destructive:
            if destructive_ok and a.model_id not in blocked_models:
                out.append(a)
        elif availability_ok and admitting(host, policy):
            out.append(a)
    return out


def destructive_problem(
    a: Action,
    plan: Plan | None,
    hosts: Mapping[str, HostSnapshot],
    profiles: Mapping[str, ModelProfile],
    retired: frozenset[str],
    policy: GovernorPolicy,
) -> str | None:
    """Why delivering destructive action ``a`` now would be unsafe, or ``None``.

    Args:
        a: a drain, unload or evict.
        plan: the latest plan (its assignments are the replacements).
        hosts: the fresh registry snapshot.
        profiles: configured profiles (their ``min_replicas`` is a floor on replacements).
        retired: retired model ids (target zero: no replacement needed).
        policy: bounds, including the route lease and its margin.
    """
    host = hosts.get(a.host_id)
    if host is None or not reachable(host, policy):
        return "host_unreachable"
    r = host.residency(a.model_id)
    if a.kind == "drain" and (r is None or r.state not in DRAINABLE_STATES):
        # The engine died or left since the tick: nothing is left to drain, and the failed
        # residency is cleaned up by an unload the next tick issues instead.
        return "not_serving"
    if a.kind == "unload":
        if a.reason == DRAIN_DEADLINE_REASON:
            return None  # the explicit decision to cut what still runs (drain deadline)
        if r is not None and r.state == "draining":
            if r.active_requests is None:
                return "activity_unknown"
            if r.active_requests > 0:
                return "in_flight"
        return None
    relocating = plan is not None and any(
        e.make_before_break and e.model_id == a.model_id and e.host_id == a.host_id
        for e in plan.evictions
    )
    if a.kind != "drain" or (a.eviction and not relocating) or a.model_id in retired:
        return None
    if releases_freely(host, policy):
        return None  # a fenced host's replica serves nothing; releasing it loses no capacity
    if plan is None:
        return "no_plan"
    assigned = [x for x in plan.assignments if x.model_id == a.model_id]
    if any(x.host_id == a.host_id for x in assigned):
        return "desired_again"
    need = required_replicas(a.model_id, plan, profiles, retired)
    profile = profiles.get(a.model_id)
    return replacement_problem(
        a.model_id,
        assigned,
        need,
        hosts,
        policy,
        lease_margin=True,
        artifact_sha256=profile.artifact_sha256 if profile is not None else None,
    )
