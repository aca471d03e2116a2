"""Read-only facts about hosts that every reconciliation and delivery check shares.

Liveness, reachability and replacement proof are decided here once so the tick and the final
delivery revalidation apply exactly the same rules (specification, "Safety invariants" 4, 5
and 7; "Local wire contract" for the 30-second lease margin).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from grid_core.planner.types import Assignment
from grid_core.reconcile.actions import Action
from grid_core.reconcile.policy import FUTURE_SKEW_S, GovernorPolicy
from grid_core.snapshot import HostSnapshot

ADMITTING_STATES = frozenset({"accepting", "throttled"})
"""Host lifecycles that accept new work (loads, warms) and count as routing-eligible."""
REACHABLE_STATES = frozenset({"accepting", "throttled", "draining", "paused"})
"""Host lifecycles that may still receive drain/unload: an owner-reclaimed machine must be
able to release the memory Grid holds on it. Unhealthy and quarantined hosts get nothing."""


def fresh(host: HostSnapshot, policy: GovernorPolicy) -> bool:
    """The host heartbeated recently and not implausibly in the future."""
    age = host.heartbeat_age_s
    return age is not None and -FUTURE_SKEW_S <= age <= policy.heartbeat_stale_s


def reachable(host: HostSnapshot, policy: GovernorPolicy) -> bool:
    """The host may receive a command at all (fresh, healthy, not fenced off)."""
    return host.healthy and fresh(host, policy) and host.state in REACHABLE_STATES


def admitting(host: HostSnapshot, policy: GovernorPolicy) -> bool:
    """The host may receive constructive work (load, warm)."""
    return reachable(host, policy) and host.state in ADMITTING_STATES


def releases_freely(host: HostSnapshot, policy: GovernorPolicy) -> bool:
    """A replica here may be released without waiting for its replacement.

    True on a host that admits no new work for good reason (paused, unhealthy, quarantined):
    its replica serves nothing and the owner or an operator wants the memory back. A
    *draining* host is being evacuated (its owner became active, existing work may finish):
    its replicas leave make before break, each only once its replacement is ready elsewhere
    (specification, "Single-machine scenario lab and logical fleet test", activity scenario;
    "Safety invariants" 3 and 5).
    """
    return not admitting(host, policy) and host.state != "draining"


def observed_at(host: HostSnapshot, now: float) -> float:
    """Server-clock time of the report this snapshot reflects (``-inf`` when never)."""
    if host.heartbeat_age_s is None:
        return float("-inf")
    return now - max(0.0, host.heartbeat_age_s)


def used_mb(host: HostSnapshot) -> int:
    """Memory held now: unmanaged use plus every residency that holds memory (MB)."""
    return host.external_used_mb + sum(r.memory_mb for r in host.residencies if r.holds_memory)


def reserved_by_actions(host: HostSnapshot, actions: Iterable[Action], now: float) -> int:
    """Memory (MB) that in-flight warms on ``host`` will take but its snapshot does not show.

    A warm counts while it may still run (active, or cancelled after delivery without a
    receipt) and after its success until a report newer than the receipt shows the process:
    a stale snapshot can therefore never make the same memory look free twice.
    """
    seen = observed_at(host, now)
    holding = {r.model_id for r in host.residencies if r.holds_memory}
    total = 0
    for a in actions:
        if a.kind != "warm" or a.host_id != host.host_id or a.model_id in holding:
            continue
        unseen_success = a.status == "succeeded" and (a.receipt_at or 0.0) >= seen
        if a.active or a.maybe_running or unseen_success:
            total += a.memory_mb
    return total


def replacement_problem(
    model_id: str,
    assignments: Iterable[Assignment],
    desired: int,
    hosts: Mapping[str, HostSnapshot],
    policy: GovernorPolicy,
    *,
    lease_margin: bool,
    artifact_sha256: str | None = None,
) -> str | None:
    """Why the desired replicas of ``model_id`` do not yet prove availability, or ``None``.

    Every desired replica must report READY, corroborated as routable, on a routing-eligible
    host, and there must be as
    many as the plan desires. An unmanaged residency on an unauthenticated host is not proof.
    When the profile declares ``artifact_sha256``, a replacement must have proved exactly
    that revision (an old or unknown digest proves nothing). With ``lease_margin`` (the
    final delivery check) each replacement's route must also have strictly more than the
    lease margin left, on the host's control record and on the engine route itself.

    Returns:
        ``None`` when proven, else a machine-stable reason.
    """
    count = 0
    for a in assignments:
        host = hosts.get(a.host_id)
        if host is None:
            return "replacement_host_missing"
        r = host.residency(model_id)
        if r is None or r.state != "ready":
            return "replacement_not_ready"
        if artifact_sha256 is not None and r.artifact_sha256 != artifact_sha256:
            return "replacement_old_revision"
        if not admitting(host, policy):
            return "replacement_host_fenced"
        if not r.routable:
            # A READY claim in the control envelope is inventory; only a live, admitted
            # engine record for the same host/model proves the route.
            return "replacement_not_routable"
        if not r.actuatable and not host.authenticated:
            return "replacement_unauthenticated"
        if lease_margin:
            left = policy.route_lease_s - max(0.0, host.heartbeat_age_s or 0.0)
            if r.route_age_s is not None:
                left = min(left, policy.route_lease_s - max(0.0, r.route_age_s))
            if left <= policy.lease_margin_s:
                return "replacement_lease_short"
        count += 1
    if count < desired:
        return "replacement_missing"
    return None
