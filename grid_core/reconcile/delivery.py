"""The delivery step: the commands one heartbeat poll carries back to its node.

:class:`Dispatcher` is the part of the controller that delivers: it selects the polling
host's active actions (:func:`select`), durably marks them delivered, revalidates the
destructive ones (:func:`destructive_problem`) and turns what survives into wire commands.

Specification, "Local wire contract": availability commands may ride any successful tick at
or after the poll's causal revision; a drain or unload needs the exact current safety
revision and, after its delivery marker is durably prepared, a final check against a fresh
registry snapshot in which every replacement route has strictly more than the lease margin
left. One unsafe member removes the model's whole destructive batch from the response.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from grid_core.planner.types import Plan
from grid_core.profile import ModelProfile
from grid_core.reconcile.actions import Action
from grid_core.reconcile.authority import Authority
from grid_core.reconcile.control import Delivery
from grid_core.reconcile.generation import Generations
from grid_core.reconcile.governor import rank_of
from grid_core.reconcile.holds import Holds
from grid_core.reconcile.issuing import command_for
from grid_core.reconcile.policy import DRAIN_DEADLINE_REASON, GovernorPolicy
from grid_core.reconcile.reconciler import DRAINABLE_STATES, required_replicas
from grid_core.reconcile.revisions import Revisions
from grid_core.reconcile.status import MAX_DELIVERY_REFUSALS, ControllerRecords, LastTick
from grid_core.reconcile.view import admitting, reachable, releases_freely, replacement_problem
from grid_core.snapshot import HostSnapshot

FreshHosts = Callable[[], tuple[float, Iterable[HostSnapshot]]]
"""Re-reads the raw registry: returns ``(now, snapshots)`` at the moment it is called."""


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


class Dispatcher:
    """The controller's delivery step: one poll's commands, durably marked and revalidated.

    The controller owns one and calls :meth:`deliver` for every command-bearing heartbeat.
    The dispatcher shares the controller's authority, revisions, holds, generations and
    latest-tick record (objects that live as long as the controller); the records that a
    restore replaces (profiles, tombstones, the action book, blocks) arrive with each call.

    Args:
        authority: mode, lease and term; only an automatic controller with authority
            delivers, and a superseded one delivers nothing.
        revisions: causal counters (does the last successful tick cover the poll?).
        holds: restart grace and membership hiccup (they hold destructive delivery).
        generations: the current plan generation is stamped on every command.
        last: the latest tick (its plan names the replacements; refusals are recorded here).
        policy: governor bounds (freshness, route lease margin).
        save: persists the controller's durable document; ``False`` when it could not.
        warn: records a warning status shows.
    """

    def __init__(
        self,
        *,
        authority: Authority,
        revisions: Revisions,
        holds: Holds,
        generations: Generations,
        last: LastTick,
        policy: GovernorPolicy,
        save: Callable[[], bool],
        warn: Callable[[str], None],
    ) -> None:
        self._authority = authority
        self._revisions = revisions
        self._holds = holds
        self._generations = generations
        self._last = last
        self._policy = policy
        self._save = save
        self._warn = warn

    def deliver(
        self,
        host_id: str,
        now: float,
        hosts: Iterable[HostSnapshot],
        poll_revision: int,
        records: ControllerRecords,
        fresh_hosts: FreshHosts | None = None,
    ) -> Delivery:
        """Commands for one command-bearing heartbeat of ``host_id``.

        Selects the host's active actions the last successful tick allows, durably marks
        them delivered, then revalidates destructive ones against a registry snapshot read
        *after* the marker is durable (``fresh_hosts``; ``hosts`` when not given) and
        unmarks and suppresses a model's whole destructive batch if any member became
        unsafe. If marking cannot be made durable, nothing is returned.

        Args:
            host_id: the polling host.
            now: wall-clock seconds (server clock).
            hosts: host snapshots the selection uses.
            poll_revision: dirty revision observed when the heartbeat arrived.
            records: the controller's profiles, tombstones, action book and blocks.
            fresh_hosts: called once, after the delivery marker is durable (specification,
                "Local wire contract": the final destructive check).

        Returns:
            The commands (only in automatic mode with authority) and the remaining authority
            in seconds of the server's clock.
        """
        auth = self._authority
        if auth.mode != "automatic" or not auth.renew(now):
            return Delivery(mode=auth.mode, commands=(), lease_ttl_s=0.0)
        host_map = {h.host_id: h for h in hosts}
        chosen = select(
            [a for a in records.book.active() if a.host_id == host_id],
            host_map.get(host_id),
            now,
            self._policy,
            availability_ok=self._revisions.reflects(poll_revision),
            destructive_ok=(
                self._revisions.safety_current() and not self._holds.destructive_delivery_held(now)
            ),
            blocked_models=frozenset(records.blocks),
        )
        if not chosen:
            return Delivery(mode=auth.mode, commands=(), lease_ttl_s=auth.ttl(now))
        fresh_marks = [a for a in chosen if not a.delivered]
        if not self._mark(fresh_marks, now):
            return Delivery(mode=auth.mode, commands=(), lease_ttl_s=auth.ttl(now))
        if fresh_hosts is not None and any(a.destructive for a in chosen):
            # The registry may have changed while the tick ran and the marker was written:
            # the final proof uses what is registered now, not the snapshot the tick saw.
            _, latest = fresh_hosts()
            host_map = {h.host_id: h for h in latest}
        unsafe = self._unsafe_models(chosen, host_map, records)
        if unsafe:
            self._withdraw(fresh_marks, unsafe, now)
            chosen = [a for a in chosen if not (a.destructive and a.model_id in unsafe)]
        if auth.superseded or (any(a.destructive for a in chosen) and not auth.confirm(now)):
            # Another controller wrote the state or holds the lease now: this instance
            # commands nothing (a destructive command asks the lease store first).
            return Delivery(mode=auth.mode, commands=(), lease_ttl_s=0.0)
        commands = tuple(
            command_for(
                a,
                generation=self._generations.current,
                authority=auth,
                embeddings=_serves_embeddings(records.profiles, a.model_id),
            )
            for a in chosen
        )
        return Delivery(mode=auth.mode, commands=commands, lease_ttl_s=auth.ttl(now))

    def _mark(self, fresh_marks: list[Action], now: float) -> bool:
        """Durably mark first deliveries; on a failed write unmark them and return False."""
        for a in fresh_marks:
            a.delivered_at = now
        if fresh_marks and not self._save():
            for a in fresh_marks:
                a.delivered_at = None
            return False
        return True

    def _unsafe_models(
        self, chosen: list[Action], host_map: Mapping[str, HostSnapshot], records: ControllerRecords
    ) -> set[str]:
        """Models with a destructive member that is unsafe now; each refusal is recorded."""
        retired = frozenset(records.tombstones)
        problems = {
            a.action_id: destructive_problem(
                a, self._last.plan, host_map, records.profiles, retired, self._policy
            )
            for a in chosen
            if a.destructive
        }
        refusals = self._last.delivery_refusals
        for aid, problem in problems.items():
            if problem is not None:
                refusals.append(f"{aid}: {problem}")
                del refusals[:-MAX_DELIVERY_REFUSALS]
        return {a.model_id for a in chosen if problems.get(a.action_id) is not None}

    def _withdraw(self, fresh_marks: list[Action], unsafe: set[str], now: float) -> None:
        """Unmark this poll's fresh destructive marks of ``unsafe`` models, durably if possible."""
        undo = [a for a in fresh_marks if a.destructive and a.model_id in unsafe]
        for a in undo:
            a.delivered_at = None
        if undo and not self._save():
            for a in undo:
                a.delivered_at = now  # keep the marker: the write's outcome is unknown
            self._warn(
                "a delivery marker could not be removed durably; the "
                "command is treated as possibly delivered"
            )


def _serves_embeddings(profiles: Mapping[str, ModelProfile], model_id: str) -> bool:
    """The model's profile says it serves embeddings (a warm starts the engine for them)."""
    profile = profiles.get(model_id)
    return profile is not None and profile.serves_embeddings
