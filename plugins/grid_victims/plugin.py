"""Built-in victim selector for staged preemption (``grid_select_victims``, firstresult).

Source: specification, "Global placement loop": the lowest-priority sufficient victim set,
preferring failed, already-draining and idle victims, then the lowest warm-back cost. The
planner has already removed external, manual, pinned, higher-priority and
minimum-residency-protected work from the candidates.
"""

from __future__ import annotations

from itertools import combinations

from grid_core import hookimpl
from grid_core.planner.preemption import VictimCandidate, VictimNeed, set_cost


def cheapest_sufficient_set(
    candidates: tuple[VictimCandidate, ...], need: VictimNeed
) -> tuple[VictimCandidate, ...] | None:
    """Exhaustively the cheapest sufficient subset (by :func:`set_cost`), smallest first.

    Candidates are bounded by the planner (at most 12), so at most 4096 subsets are checked;
    a set is only compared when every smaller size found nothing cheaper at its priority.
    """
    best: tuple[VictimCandidate, ...] | None = None
    best_cost = None
    for size in range(1, len(candidates) + 1):
        for combo in combinations(candidates, size):
            if not need.satisfied_by(combo):
                continue
            cost = set_cost(combo)
            if best_cost is None or cost < best_cost:
                best, best_cost = combo, cost
    return best


@hookimpl
def grid_select_victims(candidates: object, need: object, ctx: object) -> object | None:
    """Choose the cheapest sufficient victim set, or ``None`` when none suffices."""
    if not isinstance(need, VictimNeed):
        return None
    cands = tuple(c for c in candidates if isinstance(c, VictimCandidate))  # type: ignore[union-attr]
    return cheapest_sufficient_set(cands, need)
