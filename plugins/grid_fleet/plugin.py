"""Entry point of the grid_fleet plugin: the logical-fleet commands in ``grid test``."""

from __future__ import annotations

from grid_core.api import CliRegistry, hookimpl


@hookimpl
def grid_cli_commands(cli: CliRegistry) -> None:
    """Add start, status, watch, restart, stop, demo, replay, compete to the ``grid test`` group."""
    from grid_fleet import cli as fleet_cli

    test = cli.group("test")
    for fn in (
        fleet_cli.start,
        fleet_cli.status,
        fleet_cli.watch,
        fleet_cli.restart,
        fleet_cli.stop,
        fleet_cli.demo,
        fleet_cli.replay,
        fleet_cli.compete,
    ):
        test.command(name=fn.__name__)(fn)
