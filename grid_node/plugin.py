"""Entry point of the grid_node plugin: CLI commands and the node agent launcher."""

from __future__ import annotations

from grid_core import hookimpl
from grid_core.cliregistry import CliRegistry
from grid_core.nodelaunch import NodeLauncher


@hookimpl
def grid_cli_commands(cli: CliRegistry) -> None:
    """Add ``grid allocator node start|status|stop|drain|pause|quarantine|resume``."""
    from grid_node.cli import register

    register(cli)


@hookimpl(trylast=True)
def grid_node_launcher() -> NodeLauncher:
    """Start, inspect and stop node agents by their configuration documents.

    A default (``trylast``): a plugin answering with its own launcher (a supervisor that runs
    agents differently) is asked first.
    """
    from grid_node.launch import NodeAgentLauncher

    return NodeAgentLauncher()
