"""Reconciliation: a desired plan becomes small, safe, idempotent actions.

Public API: :func:`reconcile` (plan + snapshots + history → proposals, deferrals,
withdrawals), :func:`admit` (the mutation governor), :class:`ActionBook` and
:class:`Action` (durable action records), :class:`GovernorPolicy`.
"""

from grid_core.reconcile.actions import Action, ActionBook, action_id
from grid_core.reconcile.governor import Admission, admit
from grid_core.reconcile.policy import GovernorPolicy
from grid_core.reconcile.reconciler import (
    Deferred,
    Proposal,
    ReconcileInputs,
    ReconcileResult,
    Withdrawal,
    reconcile,
)

__all__ = [
    "Action",
    "ActionBook",
    "Admission",
    "Deferred",
    "GovernorPolicy",
    "Proposal",
    "ReconcileInputs",
    "ReconcileResult",
    "Withdrawal",
    "action_id",
    "admit",
    "reconcile",
]
