"""Entry point of the grid_server plugin: ``grid up|down|models|chat``, ``grid allocator …``
and ``grid bench proxy``."""

from __future__ import annotations

from grid_core import hookimpl
from grid_core.cliregistry import CliRegistry


@hookimpl
def grid_cli_commands(cli: CliRegistry) -> None:
    """Contribute the server's commands."""
    from grid_server import bench, cli_allocator, cli_grids, cli_keys, cli_server, cli_tls

    cli.command(cli_server.up, name="up")

    def down() -> None:
        """Stop the server 'grid up' started, after a managed node on this machine that
        serves it (identity-proven PIDs only)."""
        cli_server.down(before=cli.before_server_stop)

    cli.command(down, name="down")
    cli.command(cli_server.models, name="models")
    cli.command(cli_server.chat, name="chat")
    cli_allocator.register(cli)
    cli.group("bench").command("proxy")(bench.bench_proxy)
    cli_tls.register(cli)
    cli_keys.register(cli)
    cli_grids.register(cli)
