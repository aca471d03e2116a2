"""Helpers for testing Grid and third-party Grid plugins.

Tests never load whatever happens to be installed: build a manager with exactly the plugins
the test names.

Example::

    from grid_core.testing import plugins_with

    def test_my_forecaster():
        plugins = plugins_with(("mine", my_plugin_module))
        assert plugins.forecast(series, now, policy) is not None
"""

from __future__ import annotations

import importlib.metadata

from grid_core.plugins import Plugins, load_plugins


def builtin_entry_points(*names: str) -> list[importlib.metadata.EntryPoint]:
    """The installed ``grid`` entry points with these names (all when none given)."""
    eps = importlib.metadata.entry_points(group="grid")
    return [ep for ep in eps if not names or ep.name in names]


def plugins_with(*inline: tuple[str, object], builtins: tuple[str, ...] = ()) -> Plugins:
    """A plugin facade with exactly the named built-ins plus the given inline plugins.

    Args:
        inline: ``(name, module_or_object)`` pairs registered directly.
        builtins: entry-point names of installed plugins to load too.

    Returns:
        A fresh :class:`~grid_core.plugins.Plugins`; nothing global is touched.
    """
    eps = builtin_entry_points(*builtins) if builtins else []
    return load_plugins(
        entry_points=eps, extra=inline, disabled=frozenset(), report=lambda _line: None
    )
