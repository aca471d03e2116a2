"""``grid join --at URL -m MODEL --kind KIND`` / ``grid join --remove NAME``: external inventory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import msgspec
import typer

from grid_core.clioptions import GridOption
from grid_core.errors import ValidationError
from grid_core.grids import resolve_target
from grid_node.external import KINDS, ExternalEngine, check, external_dir, join, remove


def join_command(
    at: Annotated[str | None, typer.Option("--at", help="The engine's base URL.")] = None,
    model: Annotated[str | None, typer.Option("-m", "--model", help="Model it serves.")] = None,
    kind: Annotated[
        str, typer.Option("--kind", help=f"Runtime kind: {', '.join(KINDS)}.")
    ] = "openai",
    name: Annotated[
        str | None, typer.Option("--name", help="Name to remove it by (default from the URL).")
    ] = None,
    api_key_file: Annotated[
        Path | None, typer.Option("--api-key-file", help="File with the engine's own API key.")
    ] = None,
    grid: GridOption = None,
    remove_name: Annotated[
        str | None, typer.Option("--remove", help="Remove the joined engine NAME.")
    ] = None,
    list_joined: Annotated[bool, typer.Option("--list", help="List joined engines.")] = False,
) -> None:
    """Route to an engine Grid does not own: it serves demand and counts as inventory of its
    kind; Grid never starts, drains or stops it. ``--remove NAME`` takes it out again."""
    if remove_name is not None:
        typer.echo(f"grid: {remove(remove_name)}")
        return
    if list_joined:
        for path in sorted(external_dir().glob("*.json")):
            if path.name.endswith(".keeper.json"):
                continue
            e = msgspec.json.decode(path.read_bytes(), type=ExternalEngine)
            typer.echo(json.dumps({"name": e.name, "url": e.url, "model": e.model, "kind": e.kind}))
        return
    if not at or not model:
        msg = "grid join needs --at URL and -m MODEL (or --remove NAME, or --list)"
        raise ValidationError(msg)
    url = at.rstrip("/")
    label = name or url.split("://", 1)[-1].replace(":", "-").replace("/", "-").lower()
    check(label, url, kind)
    engine = ExternalEngine(
        name=label,
        url=url,
        model=model,
        kind=kind,
        grid_url=resolve_target(grid).url,
        api_key_file=str(api_key_file.resolve()) if api_key_file else None,
    )
    pid = join(engine)
    typer.echo(
        f"grid: joined {model} at {url} as {kind} inventory (name {label}, keeper pid {pid})"
    )
    typer.echo(
        f"grid: Grid routes to it and never stops it; remove with: grid join --remove {label}"
    )
