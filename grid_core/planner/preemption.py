"""Staged preemption: the victim side of the ``grid_select_victims`` hook.

Source: specification, "Global placement loop" (lowest-priority sufficient victim set;
failed, already-draining and idle victims first, then the lowest warm-back cost; never
external, manual, pinned or minimum-residency-protected work; the beneficiary stays
unsatisfied until a later snapshot proves the memory free; at most 64 evictions per plan) and
"Safety invariants" 3 (the deliberate drain-first exception). Idle surplus replicas, which
their model keeps only for hysteresis beyond what current demand needs, count as idle,
reclaimable work for direct demand (issue 16; :data:`SURPLUS_PRIORITY`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import msgspec

OBSOLETE_PRIORITY = -1_000_000
"""Priority given to live work no plan wants (unconfigured or beyond its desired count):
it yields to anything, so a demanded model never waits behind an obsolete process."""
SURPLUS_PRIORITY = OBSOLETE_PRIORITY + 1
"""Priority given to an idle surplus replica: one its model keeps only for hysteresis (a
burst that is over, the scale-down cooldown) beyond what current demand needs. It yields to
any direct demand like obsolete work, but obsolete work is still taken first."""
MAX_PREEMPTION_HOSTS = 16
"""Hosts evaluated per preemption: a ranked shortlist instead of treating the first host as
the whole fleet, without asking the victim selector about every host of a large fleet."""
MAX_VICTIM_CANDIDATES = 12
"""Residencies considered per host; 2**12 subsets still enumerate in milliseconds."""


class VictimCandidate(msgspec.Struct, frozen=True, kw_only=True):
    """One removable residency on one host (already filtered for ownership, pins, priority
    and minimum residency by the planner).

    Attributes:
        model_id / host_id: the residency.
        memory_mb: MB it holds now (released to the incremental ledger).
        desired_mb: MB it holds in the desired ledger (0 when it is not a kept replica).
        priority: its model's priority (:data:`OBSOLETE_PRIORITY` for unwanted work).
        state: residency state (``failed``/``draining`` are cheapest to take).
        idle: no request in flight (unknown activity is never idle).
        warm_back_s: seconds to restore it elsewhere (load+warm; 0 for obsolete work).
        surplus: a kept replica its model holds only for hysteresis, offered as an idle
            reclaimable victim (``priority`` is then :data:`SURPLUS_PRIORITY`).
    """

    model_id: str
    host_id: str
    memory_mb: int
    desired_mb: int
    priority: int
    state: str
    idle: bool
    warm_back_s: float
    surplus: bool = False

    @property
    def disruption(self) -> int:
        """0 for failed/draining, 1 for idle live work, 2 for busy or unknown work."""
        if self.state in ("failed", "draining"):
            return 0
        return 1 if self.idle else 2


class VictimNeed(msgspec.Struct, frozen=True, kw_only=True):
    """What a sufficient victim set must release on one host.

    Attributes:
        memory_mb: MB of live memory to release (incremental ledger deficit).
        desired_mb: MB of desired footprint to release (raw ledger deficit).
        slots: residencies to remove (model-slot ceiling or colocation ceiling).
        required: model ids that must be among the victims (colocation exclusions).
    """

    memory_mb: int
    desired_mb: int = 0
    slots: int = 0
    required: tuple[str, ...] = ()

    def satisfied_by(self, victims: tuple[VictimCandidate, ...] | list[VictimCandidate]) -> bool:
        """Whether ``victims`` release enough memory, footprint and slots."""
        ids = {v.model_id for v in victims}
        return (
            sum(v.memory_mb for v in victims) >= self.memory_mb
            and sum(v.desired_mb for v in victims) >= self.desired_mb
            and len(victims) >= self.slots
            and all(r in ids for r in self.required)
        )


class VictimContext(msgspec.Struct, frozen=True, kw_only=True):
    """Who benefits: the beneficiary's id and priority, and the host."""

    host_id: str
    beneficiary: str | None
    beneficiary_priority: int


@runtime_checkable
class VictimSelector(Protocol):
    """Chooses the residencies to preempt on one host (``grid_select_victims``).

    The planner validates every answer: a set that is not drawn from ``candidates`` or does not
    satisfy ``need`` is ignored (fail closed), so a selector can cost a preemption, never safety.
    """

    def __call__(
        self, candidates: Sequence[VictimCandidate], need: VictimNeed, ctx: VictimContext
    ) -> Sequence[VictimCandidate] | None:
        """The victims to drain (a subset of ``candidates``), or ``None`` when none suffices.

        Args:
            candidates: removable residencies on ``ctx.host_id`` (at most
                :data:`MAX_VICTIM_CANDIDATES`, already filtered by the planner).
            need: what the chosen set must release.
            ctx: the host and the beneficiary.
        """
        ...


VictimSetCost = tuple[int, int, float, int, int, tuple[str, ...]]
"""(highest priority, disruption, warm-back seconds, victims, MB released, model ids)."""


def set_cost(victims: tuple[VictimCandidate, ...] | list[VictimCandidate]) -> VictimSetCost:
    """Disruption cost of a victim set, compared lexicographically (smaller is better).

    Highest victim priority first (the lowest-priority sufficient set wins), then live
    disruption, then warm-back cost, then fewer victims and less memory released, then ids.
    """
    return (
        max(v.priority for v in victims),
        sum(v.disruption for v in victims),
        round(sum(v.warm_back_s for v in victims), 6),
        len(victims),
        sum(v.memory_mb for v in victims),
        tuple(sorted(v.model_id for v in victims)),
    )
