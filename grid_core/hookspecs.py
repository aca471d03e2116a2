"""Hook specifications: every extension point Grid offers to plugins.

Each hook is named ``grid_<what>`` so implementations are greppable. Registration hooks
receive a ``register`` callable instead of returning lists, so the core validates and
de-duplicates in one place (see :mod:`grid_core.plugins`). pluggy is synchronous: async work
(an engine probe) lives on the objects a hook registers, never in the hook itself.

Call sites never use ``pm.hook`` directly; they go through :class:`grid_core.plugins.Plugins`.
Plugin authors import the types named below from :mod:`grid_core.api`, which also re-exports
:data:`hookimpl`.

Override order: every built-in implementation of a first-result hook is marked
``trylast=True``, so any other plugin's implementation answers first whatever its name; a
registered object (runtime adapter, score term) from a non-default implementation replaces
the built-in object of the same name. ``grid plugins`` shows which implementation is active.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # imported only for type checkers; keeps grid_core import-light.
    from collections.abc import Mapping, Sequence

    from grid_core.cliregistry import CliRegistry
    from grid_core.demand.coactivation import CoActivationBook
    from grid_core.demand.features import RequestFeatures
    from grid_core.demand.inference import InferredDemand
    from grid_core.demand.sequence import SequenceBook
    from grid_core.demand.series import DemandSeries, Forecast, ForecastPolicy
    from grid_core.demand.types import ModelDemand
    from grid_core.nodelaunch import NodeLauncher
    from grid_core.planner.preemption import VictimCandidate, VictimContext, VictimNeed
    from grid_core.planner.scoring import ScoreTerm
    from grid_core.portfolio.types import PortfolioContext, PortfolioDecision, PortfolioSnapshot
    from grid_core.runtime import GpuDevice, RuntimeAdapter

PROJECT_NAME = "grid"
"""pluggy project name; also the entry-point group plugins are found in."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def grid_runtime_adapters(register: Callable[[RuntimeAdapter], None]) -> None:
    """Register runtime adapters (one per engine family: llama.cpp, vLLM, Ollama, ComfyUI).

    Args:
        register: call once per :class:`~grid_core.api.RuntimeAdapter` (``name`` is the
            runtime name used in profiles, e.g. ``"llama.cpp"``, plus the lifecycle
            coroutines). An adapter missing any of them is refused with one line naming the
            plugin. Two non-default adapters with one name are a
            :class:`~grid_core.errors.PluginError`; a plugin's adapter replaces a built-in one
            of the same name.
    """


@hookspec(firstresult=True)
def grid_forecast(series: DemandSeries, now: float, policy: ForecastPolicy) -> Forecast | None:
    """Forecast near-term demand for one model from its bounded bucket series.

    firstresult: exactly one forecaster answers (the built-in EWMA plugin by default).

    Args:
        series: the model's :class:`grid_core.demand.DemandSeries` (bounded buckets).
        now: wall-clock seconds (Unix) of the planning instant.
        policy: :class:`grid_core.demand.ForecastPolicy` (bucket width, EWMA alpha, horizon).

    Returns:
        A :class:`grid_core.demand.Forecast`, or ``None`` to let the next plugin answer.
    """


@hookspec
def grid_placement_score_terms(register: Callable[[ScoreTerm], None]) -> None:
    """Register placement score terms; the planner sums every registered term.

    Args:
        register: call once per :class:`~grid_core.api.ScoreTerm` (``name`` and
            ``score(model, host, ctx) -> float``, larger is better); see
            :mod:`grid_core.planner.scoring` for the context and the memoisation contract. A
            plugin's term replaces a built-in term of the same name.
    """


@hookspec(firstresult=True)
def grid_select_victims(
    candidates: Sequence[VictimCandidate], need: VictimNeed, ctx: VictimContext
) -> Sequence[VictimCandidate] | None:
    """Choose the residencies to preempt so a higher-priority replica can be placed.

    firstresult: exactly one victim selector answers (the built-in one by default).

    Args:
        candidates: removable residencies on one host (already filtered for ownership, pins,
            priority and minimum residency by the planner; at most 12).
        need: the memory (MB), desired footprint (MB) and model slots that must be released.
        ctx: the host and the beneficiary (id and priority).

    Returns:
        The chosen victims (a sequence of candidates) or ``None`` when no sufficient set exists.
    """


@hookspec(firstresult=True)
def grid_classify_request(
    features: RequestFeatures, text: str, vocabulary: tuple[str, ...]
) -> str | None:
    """Map bounded request features to one workload from the configured vocabulary.

    firstresult: exactly one classifier answers.

    Args:
        features: :class:`grid_core.demand.features.RequestFeatures` of the request.
        text: a bounded prefix of the request's text for a keyword scan done now; the
            classifier must not keep it (only the returned workload survives).
        vocabulary: the workloads the operator configured (e.g. ``("coding", "general")``).

    Returns:
        One element of ``vocabulary``, or ``None`` to let the next plugin answer.
    """


@hookspec(firstresult=True)
def grid_search_portfolio(
    snapshot: PortfolioSnapshot, ctx: PortfolioContext
) -> PortfolioDecision | None:
    """Choose a workload-to-model portfolio for unbound (``auto``) demand.

    firstresult: at most one portfolio planner answers; with none, the controller projects
    each workload onto its highest-scoring feasible model.

    Args:
        snapshot: immutable workload-forecast snapshot for this tick.
        ctx: planner-backed evaluation of candidate portfolios, within a budget.

    Returns:
        A :class:`~grid_core.portfolio.PortfolioDecision`, or ``None`` for the built-in
        projection.
    """


@hookspec(firstresult=True)
def grid_infer_demand(
    sequences: SequenceBook,
    coactivation: CoActivationBook,
    demand: Mapping[str, ModelDemand],
    workload_models: Mapping[str, str],
    now: float,
) -> Sequence[InferredDemand] | None:
    """Infer opportunistic demand from learned workflows and model co-activation.

    firstresult: the built-in ``grid_sequence`` plugin answers by default; with no
    implementation nothing is inferred (the lab's ``reactive`` control).

    Args:
        sequences: affinity-key cursors and learned transitions (read-only use).
        coactivation: per-minute activity of configured models (read-only use).
        demand: this tick's demand per configured model.
        workload_models: workload → the model currently serving it.
        now: planning instant (Unix seconds).

    Returns:
        :class:`~grid_core.demand.inference.InferredDemand` rows, or ``None`` to let the next
        plugin answer. Whatever a plugin answers is folded in as demand that fills spare
        capacity only and never authorizes a preemption.
    """


@hookspec
def grid_gpu_devices(register: Callable[[GpuDevice], None]) -> None:
    """Report accelerator devices on this host (node side).

    Args:
        register: call once per :class:`~grid_core.api.GpuDevice` (``index``, ``name``,
            ``memory_total_mb``, ``memory_used_mb`` or ``None`` when unknown); a device
            missing one is refused with one line naming the plugin. Hosts with no plugin
            report no GPU, which placement treats as zero GPUs.
    """


@hookspec(firstresult=True)
def grid_node_launcher() -> NodeLauncher | None:
    """The launcher of node agent daemons (start, inspect, stop by state directory).

    firstresult: the built-in ``grid_node`` package answers by default. Tools that run node
    agents (the logical fleet) go through it with a saved node configuration document, never
    through the node's internals.

    Returns:
        A :class:`~grid_core.api.NodeLauncher`, or ``None`` to let another plugin answer.
    """


@hookspec
def grid_cli_commands(cli: CliRegistry) -> None:
    """Contribute commands to the ``grid`` command line.

    Args:
        cli: the registry; ``cli.group("allocator")`` returns the shared Typer sub-app for that
            group (created on first use) and ``cli.command(fn, name=...)`` adds a root command.
    """
