"""The portfolio-search contract: choosing one model per unbound (``auto``) workload.

Until a plugin answers ``grid_search_portfolio``, the controller projects each workload onto
its highest-scoring feasible model (:mod:`grid_core.demand.workloads`). A portfolio planner
plugin replaces that projection with a bounded search over complete workload-to-model maps,
each evaluated by the authoritative fleet planner (specification, "Proactive observation and
portfolio planning"). This module holds only the types a search receives and returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import msgspec

from grid_core.demand.types import ModelDemand
from grid_core.planner.types import Plan
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot

MAX_PORTFOLIOS = 64
"""Distinct portfolios one search may evaluate: a catalog's size never makes a planning pass
unbounded (the specification bounds the search the same way)."""


class PortfolioSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The immutable inputs of one search (every counterfactual reuses this one snapshot).

    Attributes:
        now: planning instant (Unix seconds).
        workloads: forecast demand of unbound work, by workload name.
        profiles: the configured model profiles.
        hosts: the current host snapshots.
    """

    now: float
    workloads: dict[str, ModelDemand]
    profiles: tuple[ModelProfile, ...]
    hosts: tuple[HostSnapshot, ...]


class PortfolioDecision(msgspec.Struct, frozen=True, kw_only=True):
    """A search's answer.

    Attributes:
        mapping: workload → model id for every workload the portfolio serves.
        deferred: workloads deliberately left unserved under current capacity.
        reason: one line for status explaining the choice.
    """

    mapping: dict[str, str]
    deferred: tuple[str, ...] = ()
    reason: str = ""


class PortfolioContext(Protocol):
    """What the controller offers a search: planner-backed evaluation within a budget."""

    budget: int
    """Portfolios the search may still evaluate (at most :data:`MAX_PORTFOLIOS`)."""

    def evaluate(self, mapping: Mapping[str, str]) -> Plan:
        """The fleet plan that serving ``mapping`` (workload → model id) would produce."""
        ...


@runtime_checkable
class PortfolioSearch(Protocol):
    """Chooses a portfolio for unbound demand (``grid_search_portfolio``, firstresult)."""

    def __call__(
        self, snapshot: PortfolioSnapshot, ctx: PortfolioContext
    ) -> PortfolioDecision | None:
        """A decision, or ``None`` to fall back to the built-in projection."""
        ...
