"""Registration of the built-in portfolio search (``grid_search_portfolio``, firstresult).

The default (``trylast``): any other installed portfolio search answers first.
"""

from __future__ import annotations

from grid_core.api import PortfolioContext, PortfolioDecision, PortfolioSnapshot, hookimpl
from grid_portfolio.search import search


@hookimpl(trylast=True)
def grid_search_portfolio(
    snapshot: PortfolioSnapshot, ctx: PortfolioContext
) -> PortfolioDecision | None:
    """Choose one model per admitted workload (or defer it) by bounded joint search."""
    return search(snapshot, ctx)
