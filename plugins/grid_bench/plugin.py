"""Entry point of the grid_bench plugin: the ``grid bench`` command group."""

from __future__ import annotations

from grid_core.api import CliRegistry, hookimpl


@hookimpl
def grid_cli_commands(cli: CliRegistry) -> None:
    """Add ``grid bench plan``, ``tick`` and ``fleet`` (other bench commands register into the
    same group)."""
    from grid_bench.plan_bench import bench_plan

    bench = cli.group("bench")
    bench.command(name="plan")(bench_plan)
    from grid_bench.tick import bench_tick

    bench.command(name="tick")(bench_tick)
    from grid_bench.fleet_make import bench_fleet

    bench.command(name="fleet")(bench_fleet)
