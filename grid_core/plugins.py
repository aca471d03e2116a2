"""Plugin loading and the typed facade the core calls hooks through.

Plugins are found in the ``grid`` entry-point group, built-in ones exactly like third-party
ones. ``GRID_DISABLE_PLUGINS=name,name`` skips plugins by entry-point name. A plugin that fails
to import is reported as one line naming it and the cause; the others keep working.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Literal, Protocol, TypeGuard

import pluggy

from grid_core import hookspecs
from grid_core.cliregistry import CliRegistry
from grid_core.demand.coactivation import CoActivationBook
from grid_core.demand.features import RequestFeatures
from grid_core.demand.inference import InferredDemand
from grid_core.demand.sequence import SequenceBook
from grid_core.demand.series import DemandSeries, Forecast, ForecastPolicy
from grid_core.demand.types import ModelDemand
from grid_core.errors import PluginError
from grid_core.nodelaunch import NODE_LAUNCHER_METHODS, NodeLauncher
from grid_core.planner.hooks import PlannerHooks
from grid_core.planner.preemption import VictimCandidate, VictimContext, VictimNeed, VictimSelector
from grid_core.planner.scoring import ScoreTerm
from grid_core.portfolio.types import PortfolioContext, PortfolioDecision, PortfolioSnapshot
from grid_core.runtime import RUNTIME_ADAPTER_METHODS, GpuDevice, RuntimeAdapter

ENTRY_POINT_GROUP = hookspecs.PROJECT_NAME
DISABLE_ENV = "GRID_DISABLE_PLUGINS"


@dataclass(frozen=True)
class PluginInfo:
    """What ``grid plugins`` reports about one plugin.

    Attributes:
        name: entry-point name (also the name to use in ``GRID_DISABLE_PLUGINS``).
        module: import path of the registered module.
        distribution: distribution that declared the entry point (``None`` for inline plugins).
        version: that distribution's version.
        hooks: hook names the plugin implements, sorted.
    """

    name: str
    module: str
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...]


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded, or an object of it that was refused.

    Attributes:
        name: the plugin's entry-point name.
        cause: one line saying what is wrong (and what is missing).
        loaded: the plugin itself loaded; only the named object was refused.
    """

    name: str
    cause: str
    loaded: bool = False

    def line(self) -> str:
        """One human line for stderr and status."""
        if self.loaded:
            return f"grid: plugin '{self.name}' {self.cause}"
        return f"grid: plugin '{self.name}' was not loaded: {self.cause}"


HookKind = Literal["first_result", "collect", "broadcast"]
"""first_result: the first implementation that answers wins (the others are shadowed);
collect: every implementation registers named objects (a plugin's object replaces a built-in
one of the same name); broadcast: every implementation is called."""


@dataclass(frozen=True)
class HookStatus:
    """Which implementations of one hook are in effect (``grid plugins``).

    Attributes:
        hook: hook name (``grid_forecast``).
        kind: see :data:`HookKind`.
        active: plugins in effect, in call order (for a first-result hook, the first one
            answers and the others only when it declines with ``None``).
        shadowed: plugins whose implementation is never reached or whose every object was
            replaced by another plugin's, then each replaced object as ``plugin:object``.
        objects: for collect hooks, registered object name → plugin that provided it.
        refused: plugins whose every object for this hook was refused by validation (the
            reason is in :attr:`Plugins.failures`).
    """

    hook: str
    kind: HookKind
    active: tuple[str, ...]
    shadowed: tuple[str, ...] = ()
    objects: dict[str, str] = field(default_factory=dict)
    refused: tuple[str, ...] = ()


COLLECT_KINDS: dict[str, str] = {
    "grid_runtime_adapters": "runtime adapter",
    "grid_placement_score_terms": "score term",
}
"""Collect hooks: the objects they register are named and validated, and the facade caches them."""
UNNAMED_COLLECT_HOOKS: tuple[str, ...] = ("grid_gpu_devices",)
"""Collect hooks whose objects have no name to replace by (every device is kept) and are read
fresh each time (telemetry), so ``grid plugins`` lists their implementations without calling
them."""


def _missing_adapter_parts(obj: object) -> list[str]:
    missing = [] if _has_name(obj) else ["name (a non-empty str)"]
    for method in RUNTIME_ADAPTER_METHODS:
        fn = getattr(obj, method, None)
        if fn is None or not callable(fn):
            missing.append(f"async {method}()")
        elif not inspect.iscoroutinefunction(fn):
            missing.append(f"{method}() as a coroutine (async def)")
    return missing


def _missing_term_parts(obj: object) -> list[str]:
    missing = [] if _has_name(obj) else ["name (a non-empty str)"]
    if not callable(getattr(obj, "score", None)):
        missing.append("score(model, host, ctx)")
    return missing


def _missing_gpu_parts(obj: object) -> list[str]:
    missing = []
    checks: tuple[tuple[str, Callable[[object], bool]], ...] = (
        ("index", lambda v: isinstance(v, int)),
        ("name", lambda v: isinstance(v, str)),
        ("memory_total_mb", lambda v: isinstance(v, int)),
        ("memory_used_mb", lambda v: v is None or isinstance(v, int)),
    )
    for attr, ok in checks:
        if not hasattr(obj, attr):
            missing.append(attr)
        elif not ok(getattr(obj, attr)):
            missing.append(f"{attr} of the right type")
    return missing


class _Named(Protocol):
    name: str


def _has_name(obj: object) -> TypeGuard[_Named]:
    """Whether ``obj`` carries a non-empty ``name`` string (every collected object must)."""
    name = getattr(obj, "name", None)
    return isinstance(name, str) and bool(name)


_VALIDATORS: dict[str, tuple[Callable[[object], list[str]], str]] = {
    "grid_runtime_adapters": (_missing_adapter_parts, "grid_core.api.RuntimeAdapter"),
    "grid_placement_score_terms": (_missing_term_parts, "grid_core.api.ScoreTerm"),
    "grid_gpu_devices": (_missing_gpu_parts, "grid_core.api.GpuDevice"),
}


@dataclass
class Plugins:
    """Typed facade over the pluggy manager; the only way core code calls hooks.

    Objects that plugins register (runtime adapters, score terms, GPU devices) are checked
    against their :mod:`grid_core.api` protocol as they register; a malformed one is refused
    with one line naming the plugin and what is missing (in ``failures`` and on ``report``),
    and the plugin's other objects and the other plugins keep working.

    Attributes:
        pm: the underlying plugin manager.
        infos: loaded plugins, in load order.
        failures: plugins that failed to import or register, and refused objects.
        report: where one-line failure reports go.
    """

    pm: pluggy.PluginManager
    infos: list[PluginInfo] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)
    report: Callable[[str], None] = field(default=lambda _line: None)
    _adapters: dict[str, RuntimeAdapter] | None = None
    _terms: dict[str, ScoreTerm] | None = None
    _owners: dict[str, dict[str, str]] = field(default_factory=dict)
    _shadowed: dict[str, list[str]] = field(default_factory=dict)
    _planner_hooks: PlannerHooks | None = None
    _refused: set[str] = field(default_factory=set)
    _refused_by_hook: dict[str, set[str]] = field(default_factory=dict)

    # --- validation ---------------------------------------------------------------------
    def _refuse(self, plugin: str, cause: str) -> None:
        if cause in self._refused:  # telemetry hooks run every heartbeat: say it once
            return
        self._refused.add(cause)
        failure = PluginFailure(plugin, cause, loaded=True)
        self.failures.append(failure)
        self.report(failure.line())

    def _valid(self, hook_name: str, plugin: str, obj: object) -> bool:
        check, protocol = _VALIDATORS[hook_name]
        missing = check(obj)
        if not missing:
            return True
        self._refused_by_hook.setdefault(hook_name, set()).add(plugin)
        kind = COLLECT_KINDS.get(hook_name, "GPU device")
        label = f" '{obj.name}'" if _has_name(obj) else ""
        self._refuse(
            plugin,
            f"registered a {kind}{label} that was refused: it lacks {', '.join(missing)} "
            f"(see {protocol})",
        )
        return False

    def _call_order(self, hook_name: str) -> list[pluggy.HookImpl]:
        # pluggy calls implementations last-registered first, tryfirst before and trylast
        # after the others: the reverse of get_hookimpls().
        return list(reversed(getattr(self.pm.hook, hook_name).get_hookimpls()))

    # --- collect hooks ------------------------------------------------------------------
    def _collect(self, hook_name: str) -> dict[str, object]:
        kind = COLLECT_KINDS[hook_name]
        found: dict[str, object] = {}
        owner: dict[str, tuple[str, bool]] = {}
        shadowed: list[str] = []
        for impl in self._call_order(hook_name):
            default = bool(impl.trylast)

            def register(
                obj: object, _impl: pluggy.HookImpl = impl, _default: bool = default
            ) -> None:
                plugin = _impl.plugin_name
                # Collect-hook validators require a name, so _has_name only narrows the type.
                if not self._valid(hook_name, plugin, obj) or not _has_name(obj):
                    return
                name = obj.name
                if name in found:
                    first, first_default = owner[name]
                    if _default and not first_default:  # a plugin's object beats the default
                        shadowed.append(f"{plugin}:{name}")
                        return
                    msg = (
                        f"two plugins registered a {kind} named '{name}' ({first} and "
                        f"{plugin}); disable one of them"
                    )
                    raise PluginError(msg)
                found[name] = obj
                owner[name] = (plugin, _default)

            impl.function(**{arg: register for arg in impl.argnames})
        self._owners[hook_name] = {name: plugin for name, (plugin, _) in owner.items()}
        self._shadowed[hook_name] = shadowed
        return found

    def runtime_adapters(self) -> dict[str, RuntimeAdapter]:
        """Runtime adapters by runtime name (``"llama.cpp"`` → adapter), validated once.

        Raises:
            PluginError: two non-default plugins registered adapters with one name.
        """
        if self._adapters is None:
            found = self._collect("grid_runtime_adapters")
            self._adapters = {k: v for k, v in found.items() if isinstance(v, RuntimeAdapter)}
        return self._adapters

    def score_terms(self) -> list[ScoreTerm]:
        """Placement score terms, ordered by name so summation is deterministic.

        Raises:
            PluginError: two non-default plugins registered terms with one name.
        """
        if self._terms is None:
            found = self._collect("grid_placement_score_terms")
            self._terms = {k: v for k, v in found.items() if isinstance(v, ScoreTerm)}
        return [self._terms[k] for k in sorted(self._terms)]

    def gpu_devices(self) -> list[GpuDevice]:
        """GPU devices reported by plugins on this host (not cached: telemetry changes)."""
        out: list[GpuDevice] = []
        for impl in self._call_order("grid_gpu_devices"):

            def register(obj: object, _plugin: str = impl.plugin_name) -> None:
                if self._valid("grid_gpu_devices", _plugin, obj) and isinstance(obj, GpuDevice):
                    out.append(obj)

            impl.function(**{arg: register for arg in impl.argnames})
        return out

    # --- first-result hooks -------------------------------------------------------------
    def forecast(self, series: DemandSeries, now: float, policy: ForecastPolicy) -> Forecast | None:
        """The first forecaster's forecast for one model series, or ``None``."""
        result: Forecast | None = self.pm.hook.grid_forecast(series=series, now=now, policy=policy)
        return result

    def infer_demand(
        self,
        sequences: SequenceBook,
        coactivation: CoActivationBook,
        demand: Mapping[str, ModelDemand],
        workload_models: Mapping[str, str],
        now: float,
    ) -> list[InferredDemand]:
        """The first ``grid_infer_demand`` answer (empty when no plugin answers)."""
        result = self.pm.hook.grid_infer_demand(
            sequences=sequences,
            coactivation=coactivation,
            demand=demand,
            workload_models=workload_models,
            now=now,
        )
        if result is None:
            return []
        rows = [r for r in result if isinstance(r, InferredDemand)]
        return rows

    def select_victims(
        self, candidates: Sequence[VictimCandidate], need: VictimNeed, ctx: VictimContext
    ) -> Sequence[VictimCandidate] | None:
        """The first victim selector's choice, or ``None`` when none answers."""
        result: Sequence[VictimCandidate] | None = self.pm.hook.grid_select_victims(
            candidates=candidates, need=need, ctx=ctx
        )
        return result

    def victim_selector(self) -> VictimSelector | None:
        """The victim selector the planner should use (``None``: no plugin selects victims)."""
        return self.select_victims if self.has_impl("grid_select_victims") else None

    def planner_hooks(self) -> PlannerHooks:
        """Score terms and the victim selector as one value for :func:`grid_core.planner.plan`.

        Built once per facade, so plans memoised for it are reused across ticks.
        """
        if self._planner_hooks is None:
            self._planner_hooks = PlannerHooks(
                score_terms=tuple(self.score_terms()), victim_selector=self.victim_selector()
            )
        return self._planner_hooks

    def classify_request(
        self, features: RequestFeatures, text: str, vocabulary: tuple[str, ...]
    ) -> str | None:
        """The first classifier's workload for these features, or ``None``."""
        result: str | None = self.pm.hook.grid_classify_request(
            features=features, text=text, vocabulary=vocabulary
        )
        return result

    def search_portfolio(
        self, snapshot: PortfolioSnapshot, ctx: PortfolioContext
    ) -> PortfolioDecision | None:
        """The first portfolio planner's decision, or ``None`` (built-in projection)."""
        result: PortfolioDecision | None = self.pm.hook.grid_search_portfolio(
            snapshot=snapshot, ctx=ctx
        )
        return result

    def node_launcher(self) -> NodeLauncher:
        """The first plugin's node agent launcher.

        Raises:
            PluginError: no plugin provides one (the node package is not installed), or the
                answer lacks a launcher method (the plugin and the method are named).
        """
        launcher: object = None
        owner = ""
        for impl in self._call_order("grid_node_launcher"):  # first answer wins
            launcher, owner = impl.function(), impl.plugin_name
            if launcher is not None:
                break
        if launcher is None:
            msg = (
                "no installed plugin provides grid_node_launcher; install Grid's node agent "
                "(the grid_node package) to start node agents"
            )
            raise PluginError(msg)
        missing = [m for m in NODE_LAUNCHER_METHODS if not callable(getattr(launcher, m, None))]
        if missing or not isinstance(launcher, NodeLauncher):
            msg = (
                f"plugin {owner}: its grid_node_launcher answer lacks "
                f"{', '.join(f'{m}()' for m in missing)} (see grid_core.api.NodeLauncher)"
            )
            raise PluginError(msg)
        return launcher

    # --- broadcast hooks ----------------------------------------------------------------
    def cli_commands(self, cli: CliRegistry) -> None:
        """Let every plugin add its commands to ``cli``."""
        self.pm.hook.grid_cli_commands(cli=cli)

    def has_impl(self, hook_name: str) -> bool:
        """Whether any loaded plugin implements ``hook_name``."""
        return bool(getattr(self.pm.hook, hook_name).get_hookimpls())

    def first_impl(self, hook_name: str) -> str | None:
        """The plugin asked first for ``hook_name`` (pluggy calls the list back to front)."""
        impls = getattr(self.pm.hook, hook_name).get_hookimpls()
        return str(impls[-1].plugin_name) if impls else None

    # --- introspection ------------------------------------------------------------------
    def hook_status(self) -> list[HookStatus]:
        """Per hook Grid defines: the implementations in effect and the shadowed ones.

        Collect hooks are resolved (adapters and terms registered) to report which plugin
        provides each named object.
        """
        out: list[HookStatus] = []
        for hook_name in hook_names():
            order = [impl.plugin_name for impl in self._call_order(hook_name)]
            spec = getattr(self.pm.hook, hook_name).spec
            if spec is not None and spec.opts.get("firstresult"):
                out.append(
                    HookStatus(hook_name, "first_result", tuple(order[:1]), tuple(order[1:]))
                )
            elif hook_name in COLLECT_KINDS:
                if hook_name == "grid_runtime_adapters":
                    self.runtime_adapters()
                else:
                    self.score_terms()
                owners = self._owners.get(hook_name, {})
                providing = set(owners.values())
                refused = self._refused_by_hook.get(hook_name, set()) - providing
                out.append(
                    HookStatus(
                        hook_name,
                        "collect",
                        tuple(p for p in order if p in providing),
                        tuple(p for p in order if p not in providing and p not in refused)
                        + tuple(self._shadowed.get(hook_name, ())),
                        dict(sorted(owners.items())),
                        tuple(p for p in order if p in refused),
                    )
                )
            elif hook_name in UNNAMED_COLLECT_HOOKS:
                out.append(HookStatus(hook_name, "collect", tuple(order)))
            else:
                out.append(HookStatus(hook_name, "broadcast", tuple(order)))
        return out


def hook_names() -> list[str]:
    """Every hook Grid defines, sorted (``grid_*`` functions of :mod:`grid_core.hookspecs`)."""
    return sorted(
        name
        for name, fn in vars(hookspecs).items()
        if name.startswith("grid_") and callable(fn) and hasattr(fn, "grid_spec")
    )


def new_manager() -> pluggy.PluginManager:
    """A plugin manager with Grid's hook specifications and no plugins."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def disabled_names(environ: dict[str, str] | None = None) -> frozenset[str]:
    """Entry-point names listed in ``GRID_DISABLE_PLUGINS`` (comma separated)."""
    raw = (environ if environ is not None else os.environ).get(DISABLE_ENV, "")
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def _hooks_of(pm: pluggy.PluginManager, plugin: object) -> tuple[str, ...]:
    return tuple(sorted(caller.name for caller in pm.get_hookcallers(plugin) or ()))


def _register(
    plugins: Plugins,
    name: str,
    module: object,
    distribution: str | None,
    version: str | None,
    report: Callable[[str], None],
) -> None:
    pm = plugins.pm
    try:
        pm.register(module, name=name)
    except Exception as exc:  # a broken plugin must not take the others down
        detail = " ".join(str(exc).split())  # pluggy's messages span lines: keep one line
        failure = PluginFailure(name, f"registration failed: {type(exc).__name__}: {detail}")
        plugins.failures.append(failure)
        report(failure.line())
        return
    module_name = getattr(module, "__name__", type(module).__name__)
    plugins.infos.append(
        PluginInfo(name, module_name, distribution, version, _hooks_of(pm, module))
    )


def load_plugins(
    *,
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    extra: Iterable[tuple[str, object]] = (),
    disabled: frozenset[str] | None = None,
    report: Callable[[str], None] | None = None,
) -> Plugins:
    """Load plugins from the ``grid`` entry-point group (plus inline ``extra`` plugins).

    Args:
        entry_points: override discovery (tests); defaults to the installed group.
        extra: ``(name, module_or_object)`` pairs registered after entry points (tests,
            :mod:`grid_core.testing`).
        disabled: names to skip; defaults to ``GRID_DISABLE_PLUGINS``.
        report: where one-line failure reports go; defaults to stderr.

    Returns:
        The facade, with ``failures`` listing plugins that could not load.

    Raises:
        PluginError: a loaded plugin implements a hook Grid does not define (misspelling).
    """
    disabled = disabled_names() if disabled is None else disabled
    report = report or (lambda line: print(line, file=sys.stderr))
    plugins = Plugins(new_manager(), report=report)
    eps = (
        importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        if entry_points is None
        else entry_points
    )
    for ep in sorted(eps, key=lambda e: e.name):
        if ep.name in disabled or plugins.pm.has_plugin(ep.name):
            continue
        try:
            module = ep.load()
        except Exception as exc:  # import failure: report it, keep going
            failure = PluginFailure(
                ep.name, f"import of '{ep.value}' failed: {type(exc).__name__}: {exc}"
            )
            plugins.failures.append(failure)
            report(failure.line())
            continue
        dist = getattr(ep, "dist", None)
        _register(
            plugins,
            ep.name,
            module,
            dist.metadata["Name"] if dist is not None else None,
            dist.version if dist is not None else None,
            report,
        )
    for name, obj in extra:
        if name not in disabled:
            _register(plugins, name, obj, None, None, report)
    try:
        plugins.pm.check_pending()
    except pluggy.PluginValidationError as exc:
        msg = f"a plugin implements a hook Grid does not define: {exc}"
        raise PluginError(msg) from exc
    return plugins


_DEFAULT: Plugins | None = None


def get_plugins() -> Plugins:
    """The process-wide facade, loaded on first use from installed entry points."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = load_plugins()
    return _DEFAULT


def plugin_module(name: str) -> ModuleType | None:
    """The loaded module registered under ``name`` in the default manager, if any."""
    obj = get_plugins().pm.get_plugin(name)
    return obj if isinstance(obj, ModuleType) else None
