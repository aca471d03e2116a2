"""Grid's public plugin API: the one module a plugin imports (with :mod:`grid_core.wire`).

Everything a plugin needs — the ``hookimpl`` marker, the protocol each hook's objects satisfy,
the domain types the hooks pass, Grid's error classes and the helpers a runtime adapter or a
command-line plugin uses — is re-exported here. Built-in plugins import nothing else from
Grid (an import-linter contract in ``pyproject.toml`` holds them to it), so they double as
worked examples; ``docs/plugins.md`` is the how-to and ``examples/`` holds a complete
third-party plugin.

Hooks (see :mod:`grid_core.hookspecs` for the exact signatures):

==============================  ============  ============================================
hook                            kind          what an implementation provides
==============================  ============  ============================================
``grid_runtime_adapters``       collect       :class:`RuntimeAdapter` objects
``grid_forecast``               first result  a :class:`Forecast` (a :class:`Forecaster`)
``grid_placement_score_terms``  collect       :class:`ScoreTerm` objects
``grid_select_victims``         first result  victims (a :class:`VictimSelector`)
``grid_classify_request``       first result  a workload (a :class:`RequestClassifier`)
``grid_search_portfolio``       first result  a :class:`PortfolioDecision`
``grid_gpu_devices``            collect       :class:`GpuDevice` objects
``grid_cli_commands``           broadcast     commands added to a :class:`CliRegistry`
==============================  ============  ============================================

Override order: built-in implementations are defaults (``trylast``), so a plugin's
implementation of a first-result hook answers first whatever its name, and a plugin's runtime
adapter or score term replaces the built-in one of the same name. A malformed object is refused
when it registers, with one line naming the plugin and what is missing.
"""

from __future__ import annotations

from grid_core.cliregistry import CliRegistry
from grid_core.demand.features import WORKLOADS, RequestClassifier, RequestFeatures
from grid_core.demand.series import (
    Bucket,
    DemandSeries,
    Forecast,
    Forecaster,
    ForecastPolicy,
    percentile_ms,
)
from grid_core.demand.types import ModelDemand
from grid_core.errors import (
    ConflictError,
    ForbiddenError,
    GridError,
    NotFoundError,
    PluginError,
    StateError,
    UnavailableError,
    ValidationError,
)
from grid_core.hookspecs import PROJECT_NAME, hookimpl
from grid_core.planner.hooks import PlannerHooks
from grid_core.planner.preemption import (
    MAX_VICTIM_CANDIDATES,
    VictimCandidate,
    VictimContext,
    VictimNeed,
    VictimSelector,
    set_cost,
)
from grid_core.planner.scoring import ScoreContext, ScoreTerm
from grid_core.plugins import HookStatus, Plugins
from grid_core.portfolio import (
    MAX_PORTFOLIOS,
    PortfolioContext,
    PortfolioDecision,
    PortfolioSearch,
    PortfolioSnapshot,
)
from grid_core.profile import ModelProfile
from grid_core.runtime import (
    AdoptOutcome,
    ArtifactSpec,
    ChildRecord,
    ChildState,
    GpuDevice,
    LoadResult,
    Probe,
    RuntimeAdapter,
    RuntimeHost,
)
from grid_core.snapshot import HostSnapshot, ModelPerformance, ResidencySnapshot
from grid_core.table import render_table

ENTRY_POINT_GROUP = PROJECT_NAME
"""The entry-point group Grid loads plugins from: ``[project.entry-points.grid]``."""

__all__ = [
    "ENTRY_POINT_GROUP",
    "MAX_PORTFOLIOS",
    "MAX_VICTIM_CANDIDATES",
    "WORKLOADS",
    "AdoptOutcome",
    "ArtifactSpec",
    "Bucket",
    "ChildRecord",
    "ChildState",
    "CliRegistry",
    "ConflictError",
    "DemandSeries",
    "ForbiddenError",
    "Forecast",
    "ForecastPolicy",
    "Forecaster",
    "GpuDevice",
    "GridError",
    "HookStatus",
    "HostSnapshot",
    "LoadResult",
    "ModelDemand",
    "ModelPerformance",
    "ModelProfile",
    "NotFoundError",
    "PlannerHooks",
    "PluginError",
    "Plugins",
    "PortfolioContext",
    "PortfolioDecision",
    "PortfolioSearch",
    "PortfolioSnapshot",
    "Probe",
    "RequestClassifier",
    "RequestFeatures",
    "ResidencySnapshot",
    "RuntimeAdapter",
    "RuntimeHost",
    "ScoreContext",
    "ScoreTerm",
    "StateError",
    "UnavailableError",
    "ValidationError",
    "VictimCandidate",
    "VictimContext",
    "VictimNeed",
    "VictimSelector",
    "hookimpl",
    "percentile_ms",
    "render_table",
    "set_cost",
]
