"""The last step of a tick: what the mode lets reconciliation do, and the report status shows.

Kept out of the controller's class: given one reconciliation result, the mode and whether this
controller holds the single-writer lease, it closes withdrawn actions, lets the governor admit
a service-ordered prefix of the proposals, records the new actions in the book and assembles
the :class:`~grid_core.reconcile.status.ReconcileReport` that ``GET /allocator/status`` shows.
It also builds the wire command for a delivered action.

Specification: "Reconciliation and modes" (observe records drift, recommend proposes, only
automatic with authority acts; a withdrawn destructive batch stays blocked until proof) and
"Local wire contract" (commands carry the current generation, term and lease).
"""

from __future__ import annotations

from collections.abc import Sequence

from grid_core.reconcile.actions import Action, ActionBook
from grid_core.reconcile.authority import Authority
from grid_core.reconcile.control import build_actions
from grid_core.reconcile.governor import admit, service_key
from grid_core.reconcile.policy import DRAIN_DEADLINE_REASON, GovernorPolicy
from grid_core.reconcile.reconciler import Deferred, ReconcileResult, Withdrawal
from grid_core.reconcile.status import ReconcileReport
from grid_core.wire import Command, Mode


def apply_withdrawals(
    withdrawals: Sequence[Withdrawal],
    book: ActionBook,
    blocks: dict[str, list[str]],
    now: float,
) -> None:
    """Close the active actions reconciliation withdrew.

    A withdrawn action that was already delivered may be running on its node: its model's
    destructive work stays blocked (``blocks``: model id → action ids) until a receipt or a
    heartbeat proves what happened. Other withdrawals are plain cancellations.

    Args:
        withdrawals: what reconciliation withdrew this tick.
        book: the action book (closed actions move to its history).
        blocks: model id → withdrawn delivered action ids awaiting proof (updated here).
        now: wall-clock seconds.
    """
    for w in withdrawals:
        a = book.get(w.action_id)
        if a is None or not a.active:
            continue
        if w.status == "withdrawn":
            if a.delivered:
                ids = blocks.setdefault(a.model_id, [])
                if a.action_id not in ids:
                    ids.append(a.action_id)
            book.close(a, "withdrawn", now, w.reason)
        else:
            book.close(a, "cancelled", now, w.reason)


def issue(
    result: ReconcileResult,
    *,
    mode: Mode,
    authority: bool,
    generation: str,
    book: ActionBook,
    blocks: dict[str, list[str]],
    policy: GovernorPolicy,
    now: float,
    destructive_hold: str | None,
    mutation_hold: str | None,
) -> ReconcileReport:
    """Act on one reconciliation as the mode allows and report what happened.

    - ``observe``: every proposal becomes a deferral with reason ``observe_mode``; nothing
      is withdrawn or issued.
    - ``recommend`` (or automatic without the lease): proposals are shown, nothing acts.
    - ``automatic`` with the lease: withdrawals close their actions, the governor admits a
      prefix of the proposals within its bounds (preempting undelivered lower-class work
      where a higher class needs the slot), and the admitted ones become new actions.

    Args:
        result: the tick's reconciliation.
        mode: the controller's mode at this tick.
        authority: this controller holds the single-writer lease now.
        generation: the plan generation the new actions carry.
        book: the action book (new actions are added, withdrawn ones closed).
        blocks: model id → withdrawn delivered action ids (see :func:`apply_withdrawals`).
        policy: the governor's bounds.
        now: wall-clock seconds.
        destructive_hold: the fleet-wide hold on destructive work, if any.
        mutation_hold: the fleet-wide hold on every change (a membership hiccup), if any.

    Returns:
        The report status shows; ``issued`` lists the ids of the actions created.
    """
    issued: list[str] = []
    withdrawals = result.withdrawals
    if mutation_hold is not None:
        # During a hiccup only safety withdrawals apply; a stale view must not cancel work.
        withdrawals = [w for w in withdrawals if w.status == "withdrawn"]
    proposals = sorted(result.proposals, key=service_key)
    deferred = list(result.deferred)
    if mode == "observe":
        deferred += [
            Deferred(kind=p.kind, host_id=p.host_id, model_id=p.model_id, reason="observe_mode")
            for p in proposals
        ]
        proposals, withdrawals = [], []
    elif mode == "automatic" and authority:
        apply_withdrawals(withdrawals, book, blocks, now)
        adm = admit(proposals, book, result.free_mb, policy)
        for aid in adm.preempted:
            a = book.get(aid)
            if a is not None:
                book.close(a, "cancelled", now, "withdrawn_for_higher_class")
        deferred += adm.deferred
        for action in build_actions(adm.admitted, generation, now, book.next_order):
            if book.add(action):
                issued.append(action.action_id)
    else:
        withdrawals = []
    return ReconcileReport(
        generation=generation,
        mode=mode,
        proposals=proposals,
        deferred=deferred,
        withdrawals=withdrawals,
        issued=issued,
        hold=mutation_hold or destructive_hold,
        ready=result.ready,
    )


def command_for(a: Action, *, generation: str, authority: Authority, embeddings: bool) -> Command:
    """The wire command for a delivered action.

    Authority (term, controller id, lease end) is stamped at delivery, not at issue, so a
    restored action carries the current term.

    Args:
        a: the action being delivered.
        generation: the current plan generation.
        authority: this controller's authority.
        embeddings: the model serves embeddings (a warm starts the engine for them).
    """
    return Command(
        action_id=a.action_id,
        kind=a.kind,
        node_id=a.host_id,
        model_id=a.model_id,
        memory_mb=a.memory_mb,
        plan_generation=generation,
        controller_term=authority.term,
        controller_id=authority.controller_id,
        controller_lease_expires_at=authority.lease_expires_at,
        dependencies=list(a.dependencies),
        executable=True,
        reason=a.reason,
        created_at=a.created_at,
        not_before=a.not_before,
        artifact_sha256=a.artifact_sha256,
        artifact_source=a.artifact_source,
        artifact_size_mb=a.artifact_size_mb,
        runtime=a.runtime,
        embeddings=a.kind == "warm" and embeddings,
        ready_timeout_s=a.ready_timeout_s if a.kind == "warm" else None,
        force=a.kind == "unload" and a.reason == DRAIN_DEADLINE_REASON,
    )
