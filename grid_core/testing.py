"""Helpers for testing Grid and third-party Grid plugins.

Tests never load whatever happens to be installed: build a facade with exactly the plugins
the test names. Three ways to bring a plugin into a test:

* :class:`InlinePlugin` — hook functions written in the test itself;
* ``builtins=(...)`` — installed plugins by entry-point name (the built-in defaults);
* :func:`write_distribution` (a module written by the test) or :func:`install_project` (a
  plugin's source tree and its ``pyproject.toml``) + ``distributions=(path,)`` — a real
  distribution (dist-info with a ``grid`` entry point) found exactly as after ``pip install``.

Example::

    from grid_core.api import Forecast
    from grid_core.testing import InlinePlugin, plugins_with

    def test_my_forecaster_wins_over_the_default():
        mine = InlinePlugin("mine")

        @mine.hook
        def grid_forecast(series, now, policy):
            return Forecast(rate_rps=5.0)

        plugins = plugins_with(mine, builtins=("grid_forecast_ewma",))
        assert plugins.forecast(series, now, policy).rate_rps == 5.0
"""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TypeVar

from grid_core.hookspecs import PROJECT_NAME, hookimpl
from grid_core.plugins import Plugins, load_plugins

F = TypeVar("F", bound=Callable[..., object])


class InlinePlugin:
    """A plugin assembled in a test from hook functions (no module, no class to write).

    Args:
        name: the plugin's name (as an entry-point name would be).

    Example::

        acme = InlinePlugin("acme")

        @acme.hook
        def grid_classify_request(features, text, vocabulary):
            return "coding"
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._namespace = SimpleNamespace()

    def hook(
        self, fn: F | None = None, *, tryfirst: bool = False, trylast: bool = False
    ) -> F | Callable[[F], F]:
        """Register ``fn`` (named after the hook it implements) on this plugin.

        Usable bare (``@p.hook``) or with pluggy ordering (``@p.hook(trylast=True)``, which
        makes the implementation a default, as the built-ins are).
        """

        def add(f: F) -> F:
            marked = hookimpl(tryfirst=tryfirst, trylast=trylast)(f)
            setattr(self._namespace, f.__name__, marked)
            return f

        return add(fn) if fn is not None else add

    def pair(self) -> tuple[str, object]:
        """``(name, plugin object)`` as :func:`grid_core.plugins.load_plugins` takes it."""
        return (self.name, self._namespace)


def builtin_entry_points(*names: str) -> list[importlib.metadata.EntryPoint]:
    """The installed ``grid`` entry points with these names (all when none given)."""
    eps = importlib.metadata.entry_points(group=PROJECT_NAME)
    return [ep for ep in eps if not names or ep.name in names]


def write_distribution(
    root: Path,
    dist: str,
    module: str,
    source: str,
    *,
    version: str = "1.0",
    entry_point: str | None = None,
) -> Path:
    """Write a minimal installed distribution into ``root``: one module and its dist-info.

    The dist-info declares ``[grid] <entry_point> = <module>``, so a Python whose path holds
    ``root`` finds the plugin exactly as it would after ``pip install``.

    Args:
        root: a directory (e.g. pytest's ``tmp_path``); put it on ``sys.path`` or
            ``PYTHONPATH`` to use the plugin.
        dist: distribution name (``acme-grid-forecast``).
        module: top-level module name the source is written to (``acme_grid_forecast``).
        source: the module's source (dedented).
        version: the distribution's version.
        entry_point: the plugin's entry-point name (defaults to ``module``).

    Returns:
        The dist-info directory.
    """
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[grid]\n{entry_point or module} = {module}\n")
    return info


def install_project(project: Path, target: Path) -> Path:
    """Install a plugin's source tree into ``target`` as ``pip install --target`` lays it out.

    The distribution's name, version and ``grid`` entry points are read from the project's own
    ``pyproject.toml``; its top-level packages are linked (not copied), as an editable install
    would, so a test exercises exactly the files in the project. Use it with
    ``plugins_with(distributions=(target,))``.

    Args:
        project: directory holding ``pyproject.toml`` and the plugin's package(s).
        target: an empty directory (e.g. under pytest's ``tmp_path``).

    Returns:
        The dist-info directory written.

    Raises:
        ValueError: the project declares no ``[project.entry-points.grid]`` table.
    """
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    eps = meta.get("entry-points", {}).get(PROJECT_NAME, {})
    if not eps:
        msg = f"{project}/pyproject.toml declares no [project.entry-points.{PROJECT_NAME}] table"
        raise ValueError(msg)
    for pkg in sorted(project.iterdir()):
        if (pkg / "__init__.py").is_file() and pkg.name != "tests":
            (target / pkg.name).symlink_to(pkg.resolve(), target_is_directory=True)
    name, version = meta["name"], meta["version"]
    info = target / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{k} = {v}\n" for k, v in eps.items())
    (info / "entry_points.txt").write_text(f"[{PROJECT_NAME}]\n{lines}")
    return info


def distribution_entry_points(*paths: Path) -> list[importlib.metadata.EntryPoint]:
    """The ``grid`` entry points of the distributions installed under ``paths`` only."""
    found: list[importlib.metadata.EntryPoint] = []
    for dist in importlib.metadata.distributions(path=[str(p) for p in paths]):
        found.extend(ep for ep in dist.entry_points if ep.group == PROJECT_NAME)
    return found


def plugins_with(
    *inline: InlinePlugin | tuple[str, object],
    builtins: Sequence[str] = (),
    distributions: Iterable[Path] = (),
    report: Callable[[str], None] | None = None,
) -> Plugins:
    """A plugin facade with exactly the named plugins; nothing global is touched.

    Args:
        inline: :class:`InlinePlugin` objects or ``(name, module_or_object)`` pairs.
        builtins: entry-point names of installed plugins to load too (``"grid_scoring"``).
        distributions: directories holding distributions written by
            :func:`write_distribution`; their modules are imported from there (the
            directories are added to ``sys.path`` for the rest of the process).
        report: where one-line plugin failures go (dropped by default).

    Returns:
        A fresh :class:`~grid_core.plugins.Plugins`.
    """
    eps = builtin_entry_points(*builtins) if builtins else []
    paths = list(distributions)
    for path in paths:
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    eps += distribution_entry_points(*paths) if paths else []
    pairs = [p.pair() if isinstance(p, InlinePlugin) else p for p in inline]
    return load_plugins(
        entry_points=eps,
        extra=pairs,
        disabled=frozenset(),
        report=report or (lambda _line: None),
    )
