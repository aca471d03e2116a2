"""What the planner receives from plugins: score terms and a victim selector, as values.

The planner never sees the plugin manager. The facade builds one :class:`PlannerHooks` per
plugin set (:meth:`grid_core.plugins.Plugins.planner_hooks`), so a plan's memo key can name the
exact extension set it was computed with.
"""

from __future__ import annotations

from dataclasses import dataclass

from grid_core.planner.preemption import VictimSelector
from grid_core.planner.scoring import ScoreTerm


@dataclass(frozen=True, eq=False)
class PlannerHooks:
    """The planner's extension points for one plan.

    Identity is the value's identity (``eq=False``): two separately built sets never share a
    memoised plan, even when their terms compare equal.

    Attributes:
        score_terms: terms summed for every candidate, ordered by name (deterministic sums).
        victim_selector: chooses preemption victims; ``None`` disables staged preemption.
    """

    score_terms: tuple[ScoreTerm, ...] = ()
    victim_selector: VictimSelector | None = None


NO_HOOKS = PlannerHooks()
"""No terms and no victim selector: placement by hard rules only, never a preemption."""
