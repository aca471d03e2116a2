"""Plugin loading and the typed facade the core calls hooks through.

Plugins are found in the ``grid`` entry-point group, built-in ones exactly like third-party
ones. ``GRID_DISABLE_PLUGINS=name,name`` skips plugins by entry-point name. A plugin that fails
to import is reported as one line naming it and the cause; the others keep working.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType

import pluggy

from grid_core import hookspecs
from grid_core.errors import PluginError

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
    """A plugin that could not be loaded: its name and a one-line cause."""

    name: str
    cause: str

    def line(self) -> str:
        """One human line for stderr and status."""
        return f"grid: plugin '{self.name}' was not loaded: {self.cause}"


@dataclass
class Plugins:
    """Typed facade over the pluggy manager; the only way core code calls hooks.

    Attributes:
        pm: the underlying plugin manager.
        infos: loaded plugins, in load order.
        failures: plugins that failed to import or register.
    """

    pm: pluggy.PluginManager
    infos: list[PluginInfo] = field(default_factory=list)
    failures: list[PluginFailure] = field(default_factory=list)
    _cache: dict[str, object] = field(default_factory=dict)

    # --- registration-style hooks -------------------------------------------------------
    def _collect(self, hook_name: str, kind: str) -> dict[str, object]:
        cached = self._cache.get(hook_name)
        if cached is not None:
            return cached  # type: ignore[return-value]
        found: dict[str, object] = {}

        def register(obj: object) -> None:
            name = getattr(obj, "name", None)
            if not isinstance(name, str) or not name:
                msg = f"a {kind} was registered without a string 'name' attribute: {obj!r}"
                raise PluginError(msg)
            if name in found:
                msg = f"two plugins registered a {kind} named '{name}'; disable one of them"
                raise PluginError(msg)
            found[name] = obj

        getattr(self.pm.hook, hook_name)(register=register)
        self._cache[hook_name] = found
        return found

    def runtime_adapters(self) -> dict[str, object]:
        """Runtime adapters by runtime name (``"llama.cpp"`` → adapter)."""
        return self._collect("grid_runtime_adapters", "runtime adapter")

    def score_terms(self) -> list[object]:
        """Placement score terms, ordered by name so summation is deterministic."""
        terms = self._collect("grid_placement_score_terms", "score term")
        return [terms[k] for k in sorted(terms)]

    def gpu_devices(self) -> list[object]:
        """GPU devices reported by plugins on this host (not cached: telemetry changes)."""
        out: list[object] = []
        self.pm.hook.grid_gpu_devices(register=out.append)
        return out

    # --- firstresult hooks -------------------------------------------------------------
    def forecast(self, series: object, now: float, policy: object) -> object | None:
        """The first forecaster's forecast for one model series, or ``None``."""
        return self.pm.hook.grid_forecast(series=series, now=now, policy=policy)

    def select_victims(self, candidates: object, need: object, ctx: object) -> object | None:
        """The first victim selector's choice, or ``None`` when none answers."""
        return self.pm.hook.grid_select_victims(candidates=candidates, need=need, ctx=ctx)

    def classify_request(
        self, features: object, text: str, vocabulary: tuple[str, ...]
    ) -> str | None:
        """The first classifier's workload for these features, or ``None``."""
        return self.pm.hook.grid_classify_request(
            features=features, text=text, vocabulary=vocabulary
        )

    def search_portfolio(self, snapshot: object, ctx: object) -> object | None:
        """The first portfolio planner's decision, or ``None`` (built-in projection)."""
        return self.pm.hook.grid_search_portfolio(snapshot=snapshot, ctx=ctx)

    def cli_commands(self, cli: object) -> None:
        """Let every plugin add its commands to ``cli``."""
        self.pm.hook.grid_cli_commands(cli=cli)

    def has_impl(self, hook_name: str) -> bool:
        """Whether any loaded plugin implements ``hook_name``."""
        return bool(getattr(self.pm.hook, hook_name).get_hookimpls())


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
        failure = PluginFailure(name, f"registration failed: {type(exc).__name__}: {exc}")
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
    plugins = Plugins(new_manager())
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
