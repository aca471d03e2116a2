"""The object plugins receive in ``grid_cli_commands`` to add commands to ``grid``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import typer

HELP_MARKUP: Final = "markdown"
"""Command help is written as docstrings: Markdown rendering shows ``code`` spans as code
and joins wrapped lines into paragraphs, instead of printing the quoting and line breaks."""

GROUP_HELP: dict[str, str] = {
    "allocator": "Placement policy, modes, status, tokens and this machine's managed node.",
    "engine": "Install inference engines (llama.cpp, …).",
    "test": "Single-machine logical fleet, scenario lab and test helpers.",
    "bench": "Benchmarks that print numbers: planner, controller tick, proxy.",
}
"""Help text for well-known groups, so whichever plugin creates a group first, it reads well."""


class CliRegistry:
    """Collects sub-apps and root commands contributed by plugins.

    Several plugins may add commands to one group (``grid test`` gets commands from the
    scenario lab and from the logical fleet); the registry hands them the same Typer app.
    """

    def __init__(self, root: typer.Typer) -> None:
        self.root = root
        self._groups: dict[str, typer.Typer] = {}
        self.before_server_stop: list[Callable[[str], list[str]]] = []
        """Called by ``grid down`` with the local server's URL before it stops the server;
        each returns lines for the operator (the node plugin stops a managed node here)."""

    def on_server_stop(self, fn: Callable[[str], list[str]]) -> None:
        """Run ``fn(server_url)`` when ``grid down`` is about to stop the local server."""
        self.before_server_stop.append(fn)

    def group(self, name: str, help: str | None = None) -> typer.Typer:
        """The shared sub-app for ``grid <name>``; created and mounted on first use."""
        app = self._groups.get(name)
        if app is None:
            app = typer.Typer(
                name=name,
                help=help or GROUP_HELP.get(name),
                no_args_is_help=True,
                add_completion=False,
                rich_markup_mode=HELP_MARKUP,
            )
            self._groups[name] = app
            self.root.add_typer(app, name=name)
        return app

    def subgroup(self, parent: str, name: str, help: str | None = None) -> typer.Typer:
        """The shared sub-app for ``grid <parent> <name>`` (e.g. ``grid allocator node``)."""
        key = f"{parent} {name}"
        app = self._groups.get(key)
        if app is None:
            app = typer.Typer(
                name=name,
                help=help,
                no_args_is_help=True,
                add_completion=False,
                rich_markup_mode=HELP_MARKUP,
            )
            self._groups[key] = app
            self.group(parent).add_typer(app, name=name)
        return app

    def command(self, fn: Callable[..., object], name: str | None = None) -> None:
        """Add ``fn`` as a root command (``grid up``, ``grid chat`` …)."""
        self.root.command(name=name)(fn)
