"""``grid keys create|list|revoke`` — client API keys for a LAN-facing ``/v1``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import typer

from grid_core.client import Calls
from grid_core.clioptions import GridOption, OperatorTokenOption
from grid_core.errors import EXIT_USAGE
from grid_core.table import render_table
from grid_server.client import CliError, send
from grid_server.home import write_secret_file

FileOpt = typer.Option(
    None, "--file", help="Write the key to this file (0600) instead of printing it."
)


def create(
    name: str = typer.Argument(..., help="Who or what uses the key (an app, a team)."),
    file: Path | None = FileOpt,
    as_json: bool = typer.Option(False, "--json", help="The answer (with the key) as JSON."),
    grid: GridOption = None,
    token_file: OperatorTokenOption = None,
) -> None:
    """Create a client API key. It is shown once (or written to --file): keep it."""
    if file is not None and file.exists():
        raise CliError(f"{file} already exists; choose another path", EXIT_USAGE)
    issued = send(grid, Calls.create_client_key(name), token_file=token_file)
    if file is not None:
        write_secret_file(file, issued.key + "\n")
        typer.echo(f"grid: client key '{issued.name}' (id {issued.id}) written to {file} (0600)")
        return
    if as_json:
        typer.echo(json.dumps(msgspec.to_builtins(issued), indent=2))
        return
    typer.echo(issued.key)
    typer.echo(
        f"grid: client key '{issued.name}' (id {issued.id}); shown once: store it now. "
        "Clients send it as 'Authorization: Bearer <key>'.",
        err=True,
    )


def list_keys(
    as_json: bool = typer.Option(False, "--json", help="As JSON."),
    grid: GridOption = None,
    token_file: OperatorTokenOption = None,
) -> None:
    """List client keys by name and id (never the keys) and whether /v1 requires one."""
    data: dict[str, Any] = send(grid, Calls.client_keys(), token_file=token_file)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(f"/v1 requires a client key: {'yes' if data.get('required') else 'no'}")
    rows = [[k["name"], k["id"], f"{k['created_at']:.0f}"] for k in data.get("keys", [])]
    typer.echo(render_table(["name", "id", "created_at"], rows))


def revoke(
    name: str = typer.Argument(..., help="The key's name (see 'grid keys list')."),
    grid: GridOption = None,
    token_file: OperatorTokenOption = None,
) -> None:
    """Revoke a client key: requests carrying it are refused from now on."""
    send(grid, Calls.revoke_client_key(name), token_file=token_file)
    typer.echo(f"grid: client key '{name}' revoked")


def register(cli: Any) -> None:
    """Mount ``grid keys``."""
    group = cli.group("keys", help="Client API keys for /v1 on a server that faces the network.")
    group.command("create")(create)
    group.command("list")(list_keys)
    group.command("revoke")(revoke)
