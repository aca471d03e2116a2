"""Built-in victim selector for staged preemption (``grid_select_victims``, firstresult).

Source: specification, "Global placement loop": the lowest-priority sufficient victim set,
preferring failed, already-draining and idle victims, then the lowest warm-back cost. The
planner has already removed external, manual, pinned, higher-priority and
minimum-residency-protected work from the candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from grid_core.api import VictimCandidate, VictimContext, VictimNeed, hookimpl, set_cost


def cheapest_sufficient_set(
    candidates: Sequence[VictimCandidate], need: VictimNeed
) -> tuple[VictimCandidate, ...] | None:
    """Exhaustively the cheapest sufficient subset (by :func:`set_cost`), smallest first.

    Candidates are bounded by the planner (at most 12), so at most 4096 subsets are checked,
    and only among candidates at or below the lowest sufficient priority level.
    """
    # The highest victim priority is compared first, so only candidates up to the lowest
    # priority level whose members together suffice can be in the best set.
    pool: list[VictimCandidate] = []
    for level in sorted({c.priority for c in candidates}):
        pool = [c for c in candidates if c.priority <= level]
        if need.satisfied_by(pool):
            break
    else:
        return None
    best: tuple[VictimCandidate, ...] | None = None
    best_cost = None
    for size in range(1, len(pool) + 1):
        for combo in combinations(pool, size):
            if not need.satisfied_by(combo):
                continue
            cost = set_cost(combo)
            if best_cost is None or cost < best_cost:
                best, best_cost = combo, cost
    return best


@hookimpl(trylast=True)
def grid_select_victims(
    candidates: Sequence[VictimCandidate], need: VictimNeed, ctx: VictimContext
) -> Sequence[VictimCandidate] | None:
    """Choose the cheapest sufficient victim set, or ``None`` when none suffices.

    The default selector (``trylast``): any other installed selector answers first.
    """
    return cheapest_sufficient_set(candidates, need)
