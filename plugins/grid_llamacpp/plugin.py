"""Entry point of the grid_llamacpp plugin: the runtime adapter and its commands.

Commands: ``grid engine install llama.cpp`` and ``grid test make-model``; the adapter's
``inventory``/``infer`` serve ``grid allocator qualify llama.cpp MODEL.gguf``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from grid_core.api import CliRegistry, RuntimeAdapter, ValidationError, hookimpl


@hookimpl(trylast=True)
def grid_runtime_adapters(register: Callable[[RuntimeAdapter], None]) -> None:
    """Register the llama.cpp adapter (executable from GRID_LLAMA_SERVER, PATH or cache).

    The default adapter for ``llama.cpp`` (``trylast``): a plugin that registers its own
    ``llama.cpp`` adapter replaces this one.
    """
    from grid_llamacpp.adapter import LlamaCppAdapter

    register(LlamaCppAdapter())


def engine_install(
    runtime: Annotated[str, typer.Argument(help="Engine to install: llama.cpp")],
    force: bool = typer.Option(False, "--force", help="Rebuild even if the cached build works."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Parallel compile jobs (0 = all CPUs)."),
) -> None:
    """Build llama-server once from pinned, SHA-256-verified source; later runs reuse it."""
    from grid_llamacpp.install import check_runtime_name, install

    check_runtime_name(runtime)
    path, built, seconds = install(force=force, jobs=jobs or None, echo=typer.echo)
    if built:
        typer.echo(f"built {path} in {seconds:.0f} s")
    else:
        typer.echo(f"llama-server already installed: {path}")


def make_model(
    out: Annotated[Path, typer.Argument(help="Output .gguf path.")],
    name: str = typer.Option("grid-tiny", "--name", help="general.name in the file."),
    layers: int = typer.Option(2, "--layers", help="Transformer blocks."),
    embedding: int = typer.Option(64, "--embedding", help="Embedding width (multiple of 16)."),
    context: int = typer.Option(512, "--context", help="Context length in tokens."),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed, same bytes)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing OUT that differs."),
) -> None:
    """Write a small deterministic llama GGUF that llama-server loads and generates from.

    An existing OUT with other bytes (say a model a fleet serves, whose profile names its
    SHA-256) is kept and the command exits 2 unless --force is given; the same bytes again
    are fine.
    """
    import os

    from grid_llamacpp.artifacts import sha256_file
    from grid_llamacpp.tinymodel import TinyModelSpec
    from grid_llamacpp.tinymodel import make_model as make

    parent = out.expanduser().absolute().parent
    if not parent.is_dir():
        # A typo in the path should fail loudly, not create a new directory tree.
        msg = f"{out}: directory {parent} does not exist; create it first (mkdir -p {parent})"
        raise ValidationError(msg)
    spec = TinyModelSpec(name=name, layers=layers, embedding=embedding, context=context, seed=seed)
    if out.exists() and not force:
        # Written beside it first: only identical bytes may take its place unasked.
        fresh = out.with_name(f".{out.name}.{os.getpid()}.new")
        try:
            make(fresh, spec)
            old_sha, new_sha = sha256_file(out), sha256_file(fresh)
            if old_sha != new_sha:
                msg = (
                    f"{out} already exists with other bytes (sha256 {old_sha}, this model "
                    f"{new_sha}); pass --force to replace it, or choose another path"
                )
                raise ValidationError(msg)
        finally:
            fresh.unlink(missing_ok=True)
    size = make(out, spec)
    typer.echo(f"{out}  {size} bytes  sha256 {sha256_file(out)}")


def pull_command(
    source: Annotated[
        str, typer.Argument(help="hf://owner/repo/path.gguf, owner/repo:file.gguf or a file.")
    ],
    sha256: Annotated[str, typer.Option("--sha256", help="The GGUF's SHA-256 (required).")],
    size_mb: Annotated[
        int | None, typer.Option("--size-mb", help="Transfer ceiling in MB.")
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", envvar="GRID_NODE_STATE_DIR", help="Node state directory."),
    ] = None,
) -> None:
    """Put one exact GGUF into this node's artifact cache (progress shown; verified)."""
    from grid_llamacpp.pull import pull

    path = pull(source, sha256, size_mb, state_dir)
    typer.echo(f"{path}  sha256 {sha256}")
    typer.echo(f"profile: --artifact-sha256 {sha256} (served from the cache, no transfer)")


@hookimpl
def grid_cli_commands(cli: CliRegistry) -> None:
    """Add ``engine install`` and ``test make-model`` (``allocator qualify llama.cpp`` is the
    node's generic qualification, through this plugin's adapter)."""
    cli.group("engine").command(name="install")(engine_install)
    cli.group("test").command(name="make-model")(make_model)
    cli.command(pull_command, name="pull")
