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
``grid_infer_demand``           first result  :class:`InferredDemand` rows
``grid_gpu_devices``            collect       :class:`GpuDevice` objects
``grid_cli_commands``           broadcast     commands added to a :class:`CliRegistry`
==============================  ============  ============================================

Override order: built-in implementations are defaults (``trylast``), so a plugin's
implementation of a first-result hook answers first whatever its name, and a plugin's runtime
adapter or score term replaces the built-in one of the same name. A malformed object is refused
when it registers, with one line naming the plugin and what is missing.

Beyond the hook types, three groups of names are public:

* **Host-OS toolkit** (from :mod:`grid_core.system`): process identity proven by PID, creation
  time and command line; detached spawn; graceful stop by proven identity; durable atomic
  writes; ``GRID_HOME``; deadline polling; a concrete :class:`LocalRuntimeHost`; and
  :class:`EngineChildAdapter`, the whole lifecycle of one spawned HTTP engine child (a
  runtime plugin supplies only its command line, identity flags, readiness and activity);
  for a loopback service without authentication, :class:`GatewayAdapter` (node side) and
  :class:`EngineGateway` with :func:`run_gateway` (the gateway process). A runtime
  adapter needs these to own engine processes safely; reimplementing them is how PID-reuse and
  torn-write bugs come back.
* **Command-line helpers**: :class:`CliRegistry`, :func:`render_table`.
* **Talking to a Grid server** (from :mod:`grid_core.client`): the one typed client of the
  control API, :class:`GridClient` (blocking) and :class:`AsyncGridClient`, the call builders
  :class:`Calls` and the refusals they raise (:class:`RequestRefused`,
  :class:`ServerUnreachable`, :class:`PlainHttpRefused`).
* **Embedding the control plane** (tooling plugins such as the scenario lab, the benchmarks and
  the single-machine fleet): the real :class:`Controller`, :func:`plan` and the exact planner,
  the file state store, plugin loading, and the scenario-lab entry points. These plugins exist
  to run Grid's own decisions on synthetic or recorded inputs, so they get the same objects the
  server runs — never a copy — through this module rather than by importing internals.
"""

from __future__ import annotations

from grid_core.bodies import NodeCredential
from grid_core.client import (
    AsyncGridClient,
    Call,
    Calls,
    GridClient,
    PlainHttpRefused,
    RequestRefused,
    ServerUnreachable,
    is_loopback_host,
)
from grid_core.cliregistry import CliRegistry
from grid_core.controller import Controller
from grid_core.demand.coactivation import CoActivationBook
from grid_core.demand.desired import desired_for
from grid_core.demand.features import WORKLOADS, RequestClassifier, RequestFeatures
from grid_core.demand.inference import InferredDemand, infer_demand
from grid_core.demand.sequence import SequenceBook, SequencePrediction
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
from grid_core.gateway_adapter import GatewayAdapter
from grid_core.grids import GridEntry
from grid_core.grids import register as register_grid
from grid_core.grids import unregister as unregister_grid
from grid_core.hookspecs import PROJECT_NAME, hookimpl
from grid_core.nodeconfig import NodeConfig
from grid_core.nodelaunch import NodeLauncher, NodeProcesses
from grid_core.planner import Plan, PlanInputs, PlannerPolicy, plan
from grid_core.planner.exact import DEFAULT_TIME_LIMIT_S, exact_optimum, prime_quietly
from grid_core.planner.exact import loss_by_class as exact_loss_by_class
from grid_core.planner.hooks import NO_HOOKS, PlannerHooks
from grid_core.planner.preemption import (
    MAX_VICTIM_CANDIDATES,
    VictimCandidate,
    VictimContext,
    VictimNeed,
    VictimSelector,
    set_cost,
)
from grid_core.planner.scoring import ScoreContext, ScoreTerm
from grid_core.plugins import (
    HookStatus,
    PluginFailure,
    PluginInfo,
    Plugins,
    disabled_names,
    get_plugins,
    load_plugins,
)
from grid_core.portfolio.types import (
    MAX_CANDIDATES,
    MAX_PORTFOLIOS,
    MAX_PREEMPTION_PATHS,
    AdmissionRow,
    AdmissionThresholds,
    Candidate,
    PortfolioContext,
    PortfolioDecision,
    PortfolioReport,
    PortfolioSearch,
    PortfolioSnapshot,
    WorkloadDemand,
)
from grid_core.profile import ModelProfile, validate_profile
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
from grid_core.scenario.config import ScenarioConfig, parse_duration, parse_strategy
from grid_core.scenario.exact_check import exact_check
from grid_core.scenario.graduate import graduate
from grid_core.scenario.run import LabEnv, run_scenario
from grid_core.scenario.strategies import PREDICTIVE_PLUGINS
from grid_core.scenario.traces import MAX_TRACE_BYTES, parse_trace
from grid_core.snapshot import HostSnapshot, ModelPerformance, ResidencySnapshot
from grid_core.store import MemoryStore, StateStore
from grid_core.system import (
    BIRTH_TOLERANCE_S,
    HOME_ENV,
    OWNER_ONLY,
    ProcessIdentity,
    Proof,
    ProofStatus,
    Provable,
    SpawnedChild,
    StopOutcome,
    birth_of,
    exe_of,
    exit_status,
    fsync_dir,
    grid_home,
    is_gone,
    prove,
    reap,
    replace_durably,
    same_birth,
    scrubbed_env,
    signal_proven,
    spawn_detached,
    stop_process,
    stop_process_sync,
    wait_until,
    wait_until_sync,
    write_atomic,
)
from grid_core.system.engine_child import EngineChildAdapter, lists_model, log_tail
from grid_core.system.gateway import EngineGateway, GatewayHandler, read_keys, run_gateway
from grid_core.system.runtime_host import DEFAULT_ENGINE_PORT_RANGE, LocalRuntimeHost
from grid_core.system.state_file import FileStateStore
from grid_core.table import render_table

ENTRY_POINT_GROUP = PROJECT_NAME
"""The entry-point group Grid loads plugins from: ``[project.entry-points.grid]``."""

__all__ = [
    "BIRTH_TOLERANCE_S",
    "DEFAULT_ENGINE_PORT_RANGE",
    "DEFAULT_TIME_LIMIT_S",
    "ENTRY_POINT_GROUP",
    "HOME_ENV",
    "MAX_CANDIDATES",
    "MAX_PORTFOLIOS",
    "MAX_PREEMPTION_PATHS",
    "MAX_TRACE_BYTES",
    "MAX_VICTIM_CANDIDATES",
    "NO_HOOKS",
    "OWNER_ONLY",
    "PREDICTIVE_PLUGINS",
    "WORKLOADS",
    "AdmissionRow",
    "AdmissionThresholds",
    "AdoptOutcome",
    "ArtifactSpec",
    "AsyncGridClient",
    "Bucket",
    "Call",
    "Calls",
    "Candidate",
    "ChildRecord",
    "ChildState",
    "CliRegistry",
    "CoActivationBook",
    "ConflictError",
    "Controller",
    "DemandSeries",
    "EngineChildAdapter",
    "EngineGateway",
    "FileStateStore",
    "ForbiddenError",
    "Forecast",
    "ForecastPolicy",
    "Forecaster",
    "GatewayAdapter",
    "GatewayHandler",
    "GpuDevice",
    "GridClient",
    "GridEntry",
    "GridError",
    "HookStatus",
    "HostSnapshot",
    "InferredDemand",
    "LabEnv",
    "LoadResult",
    "LocalRuntimeHost",
    "MemoryStore",
    "ModelDemand",
    "ModelPerformance",
    "ModelProfile",
    "NodeConfig",
    "NodeCredential",
    "NodeLauncher",
    "NodeProcesses",
    "NotFoundError",
    "PlainHttpRefused",
    "Plan",
    "PlanInputs",
    "PlannerHooks",
    "PlannerPolicy",
    "PluginError",
    "PluginFailure",
    "PluginInfo",
    "Plugins",
    "PortfolioContext",
    "PortfolioDecision",
    "PortfolioReport",
    "PortfolioSearch",
    "PortfolioSnapshot",
    "Probe",
    "ProcessIdentity",
    "Proof",
    "ProofStatus",
    "Provable",
    "RequestClassifier",
    "RequestFeatures",
    "RequestRefused",
    "ResidencySnapshot",
    "RuntimeAdapter",
    "RuntimeHost",
    "ScenarioConfig",
    "ScoreContext",
    "ScoreTerm",
    "SequenceBook",
    "SequencePrediction",
    "ServerUnreachable",
    "SpawnedChild",
    "StateError",
    "StateStore",
    "StopOutcome",
    "UnavailableError",
    "ValidationError",
    "VictimCandidate",
    "VictimContext",
    "VictimNeed",
    "VictimSelector",
    "WorkloadDemand",
    "birth_of",
    "desired_for",
    "disabled_names",
    "exact_check",
    "exact_loss_by_class",
    "exact_optimum",
    "exe_of",
    "exit_status",
    "fsync_dir",
    "get_plugins",
    "graduate",
    "grid_home",
    "hookimpl",
    "infer_demand",
    "is_gone",
    "is_loopback_host",
    "lists_model",
    "load_plugins",
    "log_tail",
    "parse_duration",
    "parse_strategy",
    "parse_trace",
    "percentile_ms",
    "plan",
    "prime_quietly",
    "prove",
    "read_keys",
    "reap",
    "register_grid",
    "render_table",
    "replace_durably",
    "run_gateway",
    "run_scenario",
    "same_birth",
    "scrubbed_env",
    "set_cost",
    "signal_proven",
    "spawn_detached",
    "stop_process",
    "stop_process_sync",
    "unregister_grid",
    "validate_profile",
    "wait_until",
    "wait_until_sync",
    "write_atomic",
]
