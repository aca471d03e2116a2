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
  :class:`ServerUnreachable`, :class:`PlainHttpRefused`), and the bodies an operator call
  carries that a plugin builds itself (:class:`EvaluationBody`).
* **Embedding the control plane** (tooling plugins such as the scenario lab, the benchmarks and
  the single-machine fleet): the real :class:`Controller`, :func:`plan` and the exact planner,
  the file state store, plugin loading, and the scenario-lab entry points. These plugins exist
  to run Grid's own decisions on synthetic or recorded inputs, so they get the same objects the
  server runs — never a copy — through this module rather than by importing internals.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from grid_core.hookspecs import PROJECT_NAME, hookimpl

if TYPE_CHECKING:
    from grid_core.bodies import EvaluationBody, NodeCredential
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
        SettingsConflictError,
        StateError,
        UnavailableError,
        ValidationError,
    )
    from grid_core.gateway_adapter import GatewayAdapter
    from grid_core.grids import GridEntry
    from grid_core.grids import register as register_grid
    from grid_core.grids import unregister as unregister_grid
    from grid_core.nodeconfig import NodeConfig
    from grid_core.nodelaunch import NodeLauncher, NodeProcesses
    from grid_core.planner import NATIVE as PLANNER_BUILD
    from grid_core.planner import Plan, PlanInputs, PlannerPolicy, plan
    from grid_core.planner.exact import DEFAULT_TIME_LIMIT_S, exact_optimum, prime_quietly
    from grid_core.planner.exact import loss_by_class as exact_loss_by_class
    from grid_core.planner.hooks import NO_HOOKS, PlannerHooks
    from grid_core.planner.lastready import established
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
    from grid_core.scenario.config import (
        ScenarioConfig,
        check_seed,
        parse_duration,
        parse_strategy,
    )
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
        SAFE_PATH_FLAG,
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

_SOURCES: dict[str, tuple[str, str]] = {
    "EvaluationBody": ("grid_core.bodies", "EvaluationBody"),
    "NodeCredential": ("grid_core.bodies", "NodeCredential"),
    "AsyncGridClient": ("grid_core.client", "AsyncGridClient"),
    "Call": ("grid_core.client", "Call"),
    "Calls": ("grid_core.client", "Calls"),
    "GridClient": ("grid_core.client", "GridClient"),
    "PlainHttpRefused": ("grid_core.client", "PlainHttpRefused"),
    "RequestRefused": ("grid_core.client", "RequestRefused"),
    "ServerUnreachable": ("grid_core.client", "ServerUnreachable"),
    "is_loopback_host": ("grid_core.client", "is_loopback_host"),
    "CliRegistry": ("grid_core.cliregistry", "CliRegistry"),
    "Controller": ("grid_core.controller", "Controller"),
    "CoActivationBook": ("grid_core.demand.coactivation", "CoActivationBook"),
    "desired_for": ("grid_core.demand.desired", "desired_for"),
    "WORKLOADS": ("grid_core.demand.features", "WORKLOADS"),
    "RequestClassifier": ("grid_core.demand.features", "RequestClassifier"),
    "RequestFeatures": ("grid_core.demand.features", "RequestFeatures"),
    "InferredDemand": ("grid_core.demand.inference", "InferredDemand"),
    "infer_demand": ("grid_core.demand.inference", "infer_demand"),
    "SequenceBook": ("grid_core.demand.sequence", "SequenceBook"),
    "SequencePrediction": ("grid_core.demand.sequence", "SequencePrediction"),
    "Bucket": ("grid_core.demand.series", "Bucket"),
    "DemandSeries": ("grid_core.demand.series", "DemandSeries"),
    "Forecast": ("grid_core.demand.series", "Forecast"),
    "Forecaster": ("grid_core.demand.series", "Forecaster"),
    "ForecastPolicy": ("grid_core.demand.series", "ForecastPolicy"),
    "percentile_ms": ("grid_core.demand.series", "percentile_ms"),
    "ModelDemand": ("grid_core.demand.types", "ModelDemand"),
    "ConflictError": ("grid_core.errors", "ConflictError"),
    "ForbiddenError": ("grid_core.errors", "ForbiddenError"),
    "GridError": ("grid_core.errors", "GridError"),
    "NotFoundError": ("grid_core.errors", "NotFoundError"),
    "PluginError": ("grid_core.errors", "PluginError"),
    "SettingsConflictError": ("grid_core.errors", "SettingsConflictError"),
    "StateError": ("grid_core.errors", "StateError"),
    "UnavailableError": ("grid_core.errors", "UnavailableError"),
    "ValidationError": ("grid_core.errors", "ValidationError"),
    "GatewayAdapter": ("grid_core.gateway_adapter", "GatewayAdapter"),
    "GridEntry": ("grid_core.grids", "GridEntry"),
    "register_grid": ("grid_core.grids", "register"),
    "unregister_grid": ("grid_core.grids", "unregister"),
    "NodeConfig": ("grid_core.nodeconfig", "NodeConfig"),
    "NodeLauncher": ("grid_core.nodelaunch", "NodeLauncher"),
    "NodeProcesses": ("grid_core.nodelaunch", "NodeProcesses"),
    "Plan": ("grid_core.planner", "Plan"),
    "PlanInputs": ("grid_core.planner", "PlanInputs"),
    "PlannerPolicy": ("grid_core.planner", "PlannerPolicy"),
    "plan": ("grid_core.planner", "plan"),
    "PLANNER_BUILD": ("grid_core.planner", "NATIVE"),
    "DEFAULT_TIME_LIMIT_S": ("grid_core.planner.exact", "DEFAULT_TIME_LIMIT_S"),
    "exact_optimum": ("grid_core.planner.exact", "exact_optimum"),
    "prime_quietly": ("grid_core.planner.exact", "prime_quietly"),
    "exact_loss_by_class": ("grid_core.planner.exact", "loss_by_class"),
    "NO_HOOKS": ("grid_core.planner.hooks", "NO_HOOKS"),
    "established": ("grid_core.planner.lastready", "established"),
    "PlannerHooks": ("grid_core.planner.hooks", "PlannerHooks"),
    "MAX_VICTIM_CANDIDATES": ("grid_core.planner.preemption", "MAX_VICTIM_CANDIDATES"),
    "VictimCandidate": ("grid_core.planner.preemption", "VictimCandidate"),
    "VictimContext": ("grid_core.planner.preemption", "VictimContext"),
    "VictimNeed": ("grid_core.planner.preemption", "VictimNeed"),
    "VictimSelector": ("grid_core.planner.preemption", "VictimSelector"),
    "set_cost": ("grid_core.planner.preemption", "set_cost"),
    "ScoreContext": ("grid_core.planner.scoring", "ScoreContext"),
    "ScoreTerm": ("grid_core.planner.scoring", "ScoreTerm"),
    "HookStatus": ("grid_core.plugins", "HookStatus"),
    "PluginFailure": ("grid_core.plugins", "PluginFailure"),
    "PluginInfo": ("grid_core.plugins", "PluginInfo"),
    "Plugins": ("grid_core.plugins", "Plugins"),
    "disabled_names": ("grid_core.plugins", "disabled_names"),
    "get_plugins": ("grid_core.plugins", "get_plugins"),
    "load_plugins": ("grid_core.plugins", "load_plugins"),
    "MAX_CANDIDATES": ("grid_core.portfolio.types", "MAX_CANDIDATES"),
    "MAX_PORTFOLIOS": ("grid_core.portfolio.types", "MAX_PORTFOLIOS"),
    "MAX_PREEMPTION_PATHS": ("grid_core.portfolio.types", "MAX_PREEMPTION_PATHS"),
    "AdmissionRow": ("grid_core.portfolio.types", "AdmissionRow"),
    "AdmissionThresholds": ("grid_core.portfolio.types", "AdmissionThresholds"),
    "Candidate": ("grid_core.portfolio.types", "Candidate"),
    "PortfolioContext": ("grid_core.portfolio.types", "PortfolioContext"),
    "PortfolioDecision": ("grid_core.portfolio.types", "PortfolioDecision"),
    "PortfolioReport": ("grid_core.portfolio.types", "PortfolioReport"),
    "PortfolioSearch": ("grid_core.portfolio.types", "PortfolioSearch"),
    "PortfolioSnapshot": ("grid_core.portfolio.types", "PortfolioSnapshot"),
    "WorkloadDemand": ("grid_core.portfolio.types", "WorkloadDemand"),
    "ModelProfile": ("grid_core.profile", "ModelProfile"),
    "validate_profile": ("grid_core.profile", "validate_profile"),
    "AdoptOutcome": ("grid_core.runtime", "AdoptOutcome"),
    "ArtifactSpec": ("grid_core.runtime", "ArtifactSpec"),
    "ChildRecord": ("grid_core.runtime", "ChildRecord"),
    "ChildState": ("grid_core.runtime", "ChildState"),
    "GpuDevice": ("grid_core.runtime", "GpuDevice"),
    "LoadResult": ("grid_core.runtime", "LoadResult"),
    "Probe": ("grid_core.runtime", "Probe"),
    "RuntimeAdapter": ("grid_core.runtime", "RuntimeAdapter"),
    "RuntimeHost": ("grid_core.runtime", "RuntimeHost"),
    "ScenarioConfig": ("grid_core.scenario.config", "ScenarioConfig"),
    "check_seed": ("grid_core.scenario.config", "check_seed"),
    "parse_duration": ("grid_core.scenario.config", "parse_duration"),
    "parse_strategy": ("grid_core.scenario.config", "parse_strategy"),
    "exact_check": ("grid_core.scenario.exact_check", "exact_check"),
    "graduate": ("grid_core.scenario.graduate", "graduate"),
    "LabEnv": ("grid_core.scenario.run", "LabEnv"),
    "run_scenario": ("grid_core.scenario.run", "run_scenario"),
    "PREDICTIVE_PLUGINS": ("grid_core.scenario.strategies", "PREDICTIVE_PLUGINS"),
    "MAX_TRACE_BYTES": ("grid_core.scenario.traces", "MAX_TRACE_BYTES"),
    "parse_trace": ("grid_core.scenario.traces", "parse_trace"),
    "HostSnapshot": ("grid_core.snapshot", "HostSnapshot"),
    "ModelPerformance": ("grid_core.snapshot", "ModelPerformance"),
    "ResidencySnapshot": ("grid_core.snapshot", "ResidencySnapshot"),
    "MemoryStore": ("grid_core.store", "MemoryStore"),
    "StateStore": ("grid_core.store", "StateStore"),
    "BIRTH_TOLERANCE_S": ("grid_core.system", "BIRTH_TOLERANCE_S"),
    "HOME_ENV": ("grid_core.system", "HOME_ENV"),
    "OWNER_ONLY": ("grid_core.system", "OWNER_ONLY"),
    "ProcessIdentity": ("grid_core.system", "ProcessIdentity"),
    "Proof": ("grid_core.system", "Proof"),
    "SAFE_PATH_FLAG": ("grid_core.system", "SAFE_PATH_FLAG"),
    "ProofStatus": ("grid_core.system", "ProofStatus"),
    "Provable": ("grid_core.system", "Provable"),
    "SpawnedChild": ("grid_core.system", "SpawnedChild"),
    "StopOutcome": ("grid_core.system", "StopOutcome"),
    "birth_of": ("grid_core.system", "birth_of"),
    "exe_of": ("grid_core.system", "exe_of"),
    "exit_status": ("grid_core.system", "exit_status"),
    "fsync_dir": ("grid_core.system", "fsync_dir"),
    "grid_home": ("grid_core.system", "grid_home"),
    "is_gone": ("grid_core.system", "is_gone"),
    "prove": ("grid_core.system", "prove"),
    "reap": ("grid_core.system", "reap"),
    "replace_durably": ("grid_core.system", "replace_durably"),
    "same_birth": ("grid_core.system", "same_birth"),
    "scrubbed_env": ("grid_core.system", "scrubbed_env"),
    "signal_proven": ("grid_core.system", "signal_proven"),
    "spawn_detached": ("grid_core.system", "spawn_detached"),
    "stop_process": ("grid_core.system", "stop_process"),
    "stop_process_sync": ("grid_core.system", "stop_process_sync"),
    "wait_until": ("grid_core.system", "wait_until"),
    "wait_until_sync": ("grid_core.system", "wait_until_sync"),
    "write_atomic": ("grid_core.system", "write_atomic"),
    "EngineChildAdapter": ("grid_core.system.engine_child", "EngineChildAdapter"),
    "lists_model": ("grid_core.system.engine_child", "lists_model"),
    "log_tail": ("grid_core.system.engine_child", "log_tail"),
    "EngineGateway": ("grid_core.system.gateway", "EngineGateway"),
    "GatewayHandler": ("grid_core.system.gateway", "GatewayHandler"),
    "read_keys": ("grid_core.system.gateway", "read_keys"),
    "run_gateway": ("grid_core.system.gateway", "run_gateway"),
    "DEFAULT_ENGINE_PORT_RANGE": ("grid_core.system.runtime_host", "DEFAULT_ENGINE_PORT_RANGE"),
    "LocalRuntimeHost": ("grid_core.system.runtime_host", "LocalRuntimeHost"),
    "FileStateStore": ("grid_core.system.state_file", "FileStateStore"),
    "render_table": ("grid_core.table", "render_table"),
}
"""Public name → (module, attribute). Names load on first use (PEP 562 module
``__getattr__``), so a command that needs only the CLI registry does not import the planner,
the controller or the HTTP stacks. ``tests/unit/core/test_api_lazy.py`` keeps this table and
the type-checking imports above in step."""


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use and cache the value in this module."""
    try:
        module, attribute = _SOURCES[name]
    except KeyError:
        msg = f"module 'grid_core.api' has no attribute {name!r}"
        raise AttributeError(msg) from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SOURCES})


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
    "PLANNER_BUILD",
    "PREDICTIVE_PLUGINS",
    "SAFE_PATH_FLAG",
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
    "EvaluationBody",
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
    "SettingsConflictError",
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
    "check_seed",
    "desired_for",
    "disabled_names",
    "established",
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
