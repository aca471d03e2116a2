"""``grid grids add|list|use|remove`` — named grids in ``$GRID_HOME/grids.json``.

Each grid has a URL and, optionally, the CA its server is verified with, the operator token
file, a client key file and a node credential file (paths only: the config holds no secret).
``--grid NAME`` on any command then picks all of them; ``grid grids use NAME`` makes NAME the
default when ``--grid`` is omitted (``use local`` returns to this machine's server).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import typer

from grid_core.client import check_credential_transport
from grid_core.errors import EXIT_USAGE, GridError
from grid_core.grids import GridEntry, check_name, check_url, load_config, save_config
from grid_core.table import render_table
from grid_core.tls import client_context
from grid_server.client import CliError, home_dir

CaOpt = typer.Option(None, "--ca", help="CA certificate the server is verified with (ca.pem).")
TokenOpt = typer.Option(None, "--token-file", help="Operator capability file for this grid.")
KeyOpt = typer.Option(None, "--client-key-file", help="Client API key file for /v1.")
NodeOpt = typer.Option(None, "--node-token-file", help="Node credential file (on a worker).")


def _abs(path: Path | None, flag: str) -> str | None:
    if path is None:
        return None
    resolved = path.expanduser().resolve()
    if not resolved.is_file():
        raise CliError(f"{flag} {path}: no such file", EXIT_USAGE)
    return str(resolved)


def add(
    name: str = typer.Argument(..., help="A short name, e.g. office."),
    url: str = typer.Argument(..., help="The server URL, e.g. https://grid.lan:22100."),
    ca: Path | None = CaOpt,
    token_file: Path | None = TokenOpt,
    client_key_file: Path | None = KeyOpt,
    node_token_file: Path | None = NodeOpt,
    default: bool = typer.Option(False, "--default", help="Also make it the default grid."),
    force: bool = typer.Option(False, "--force", help="Replace a grid of the same name."),
) -> None:
    """Add a named grid (its CA is loaded once to check it)."""
    try:
        check_name(name)
        clean = check_url(url)
        check_credential_transport(clean, "credentials")
        if ca is not None:
            client_context(ca.expanduser())
    except GridError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    config = load_config(home_dir())
    if name in config.grids and not force:
        raise CliError(f"grid '{name}' exists; pass --force to replace it", EXIT_USAGE)
    entry = GridEntry(
        url=clean,
        ca_file=_abs(ca, "--ca"),
        token_file=_abs(token_file, "--token-file"),
        client_key_file=_abs(client_key_file, "--client-key-file"),
        node_token_file=_abs(node_token_file, "--node-token-file"),
    )
    config.grids[name] = entry
    if default or config.default is None:
        config.default = name
    path = save_config(config, home_dir())
    mark = " (default)" if config.default == name else ""
    typer.echo(f"grid: added grid '{name}' → {clean}{mark} in {path}")


def list_grids(as_json: bool = typer.Option(False, "--json", help="As JSON.")) -> None:
    """List the named grids and which one is the default."""
    config = load_config(home_dir())
    if as_json:
        typer.echo(json.dumps(msgspec.to_builtins(config), indent=2))
        return
    rows = [
        [
            ("* " if name == config.default else "  ") + name,
            e.url,
            e.ca_file or "-",
            e.token_file or "-",
            e.client_key_file or "-",
        ]
        for name, e in sorted(config.grids.items())
    ]
    if not rows:
        typer.echo("(no named grids; the default is this machine's server: grid grids add …)")
        return
    typer.echo(render_table(["grid", "url", "ca", "token file", "client key file"], rows))


def use(name: str = typer.Argument(..., help="A grid name, or 'local'.")) -> None:
    """Make NAME the grid commands use when --grid is omitted ('local': this machine's)."""
    config = load_config(home_dir())
    if name != "local" and name not in config.grids:
        known = ", ".join(sorted(config.grids)) or "none"
        raise CliError(f"no grid named '{name}' (grids: {known})", EXIT_USAGE)
    config.default = None if name == "local" else name
    save_config(config, home_dir())
    typer.echo(f"grid: default grid is now '{name}'")


def remove(name: str = typer.Argument(..., help="The grid to forget.")) -> None:
    """Forget a named grid (its files are left alone)."""
    config = load_config(home_dir())
    if name not in config.grids:
        known = ", ".join(sorted(config.grids)) or "none"
        raise CliError(f"no grid named '{name}' (grids: {known})", EXIT_USAGE)
    del config.grids[name]
    if config.default == name:
        config.default = None
    save_config(config, home_dir())
    typer.echo(f"grid: removed grid '{name}'")


def register(cli: object) -> None:
    """Mount ``grid grids``."""
    from grid_core.cliregistry import CliRegistry

    assert isinstance(cli, CliRegistry)
    group = cli.group("grids", help="Named grids: URL, CA and credential files per grid.")
    group.command("add")(add)
    group.command("list")(list_grids)
    group.command("use")(use)
    group.command("remove")(remove)
