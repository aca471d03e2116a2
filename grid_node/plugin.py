"""Entry point of the grid_node plugin (CLI commands)."""

from __future__ import annotations

from grid_core import hookimpl
from grid_core.cliregistry import CliRegistry


@hookimpl
def grid_cli_commands(cli: CliRegistry) -> None:
    """Add ``grid allocator node start|status|stop|drain|pause|quarantine|resume``."""
    from grid_node.cli import register

    register(cli)
