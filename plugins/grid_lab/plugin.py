"""Entry point of the grid_lab plugin: ``grid test scenario``, ``graduate`` and ``exact``."""

from __future__ import annotations

from grid_core.api import CliRegistry, hookimpl


@hookimpl
def grid_cli_commands(cli: CliRegistry) -> None:
    """Add the scenario lab's commands to the shared ``grid test`` group."""
    from grid_lab import cli as lab_cli

    test = cli.group("test")
    test.command(name="scenario")(lab_cli.scenario)
    test.command(name="graduate")(lab_cli.graduate_cmd)
    test.command(name="exact")(lab_cli.exact_cmd)
