"""Build the planner's native modules with mypyc (:mod:`grid_core.planner.native`).

Run as ``python -m grid_core.system.native_build`` (``make native`` does, and ``make venv``
and ``make test`` through it). Nothing happens when a build of the current sources exists.
Otherwise the compiled modules are built in a temporary directory beside the final one and
moved into place only when complete (its manifest is written last); only the newest few
builds are kept (:data:`BUILDS_KEPT`). Needs mypy (the ``dev`` or ``native`` extra) and a
C compiler.

Exit codes: 0 built or already current; 1 the build failed (mypyc's and the compiler's
output is shown); 2 mypy or setuptools is not installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from grid_core.planner import native

BUILD_TIMEOUT_S = 1800.0
"""Seconds the mypyc build may take: about 70 s on a 2-core machine; a generous bound so a
loaded machine still finishes, while a stuck compiler does not hang ``make`` for ever."""
BUILDS_KEPT = 4
"""Native builds kept per interpreter (about 4 MB each): the current one and the newest
others, so switching between a few branches or checkouts does not rebuild every time."""
OPT_LEVEL = "3"
"""The C compiler's optimisation level for the compiled modules (mypyc's default)."""

_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
paths, c_dir, lib_dir, tmp_dir, opt = sys.argv[1:6]
setup(
    name="grid-planner-native",
    ext_modules=mypycify(paths.split(","), opt_level=opt, target_dir=c_dir),
    script_args=["-q", "build_ext", "--build-lib", lib_dir, "--build-temp", tmp_dir],
)
"""


class NativeBuildError(Exception):
    """The native build could not be completed; the message names the failing step."""

    exit_code = 1


class MissingToolError(NativeBuildError):
    """mypy (mypyc) or setuptools is not installed."""

    exit_code = 2


def build(*, force: bool = False) -> tuple[Path, bool]:
    """Build the native planner for the current sources unless a build exists.

    Args:
        force: rebuild even when a build of these sources exists.

    Returns:
        ``(build directory, built)``: ``built`` is False when an existing build was kept.

    Raises:
        MissingToolError: mypy or setuptools is missing.
        NativeBuildError: the compile failed or took more than :data:`BUILD_TIMEOUT_S` (the
            message carries the compiler's output tail).
    """
    for needed in ("mypyc.build", "setuptools"):
        try:
            __import__(needed)
        except ImportError as exc:
            msg = f"{needed} is not installed ({exc}); install Grid's 'dev' or 'native' extra"
            raise MissingToolError(msg) from exc
    digest = native.source_digest()
    final = native.build_dir(digest)
    if (final / native.MANIFEST_NAME).is_file() and not force:
        return final, False
    root = native.native_root()
    root.mkdir(parents=True, exist_ok=True)
    src_root = Path(native.__file__).resolve().parents[2]
    modules = native.compiled_modules()
    with tempfile.TemporaryDirectory(prefix=".building-", dir=root) as tmp:
        staging = Path(tmp) / "lib"
        paths = ",".join(f"grid_core/planner/{m}" for m in modules)
        dirs = [f"{tmp}/c", str(staging), f"{tmp}/t"]
        argv = [sys.executable, "-c", _SETUP, paths, *dirs, OPT_LEVEL]
        _run(argv, src_root)
        (staging / native.MANIFEST_NAME).write_text("\n".join(modules) + "\n")
        if native.source_digest() != digest:
            msg = "grid_core's sources changed during the build; run it again"
            raise NativeBuildError(msg)
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
    _remove_older(root, keep=final)
    return final, True


def _run(argv: list[str], cwd: Path) -> None:
    """Run the mypyc build in ``cwd`` (the directory holding ``grid_core``, so module names
    match paths and mypy reads the project's configuration).

    Raises:
        NativeBuildError: non-zero exit or timeout, with the output's last lines.
    """
    try:
        done = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        msg = f"the mypyc build took more than {BUILD_TIMEOUT_S:.0f} s and was stopped"
        raise NativeBuildError(msg) from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        msg = f"the mypyc build failed (exit {done.returncode}):\n{tail}"
        raise NativeBuildError(msg)


def _remove_older(root: Path, keep: Path) -> None:
    """Keep ``keep`` and this interpreter's :data:`BUILDS_KEPT` - 1 newest other builds
    (another branch or checkout sharing the environment reuses its own); remove older ones
    and the leftovers of builds stopped more than :data:`BUILD_TIMEOUT_S` ago."""
    tag = f"{sys.implementation.cache_tag}-"
    others = [e for e in root.iterdir() if e != keep and e.is_dir() and e.name.startswith(tag)]
    others.sort(key=lambda e: e.stat().st_mtime, reverse=True)
    stale = others[BUILDS_KEPT - 1 :]
    # a stopped build's leftovers; a younger one may be another build still running
    cutoff = time.time() - BUILD_TIMEOUT_S
    stale += [
        e
        for e in root.iterdir()
        if e.name.startswith(".building-") and e.is_dir() and e.stat().st_mtime < cutoff
    ]
    for entry in stale:
        shutil.rmtree(entry, ignore_errors=True)


def is_current() -> bool:
    """Whether a complete native build of the current sources exists."""
    return (native.build_dir(native.source_digest()) / native.MANIFEST_NAME).is_file()


def main(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when current.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Build the planner's native (mypyc) modules for the current sources; a no-op when a
    build of them exists. Prints one line, or one JSON object with ``--json``: ``path``,
    ``built`` (false when kept) and ``seconds``."""
    if not as_json and (force or not is_current()):
        typer.echo("grid: building the native planner with mypyc (about a minute) ...")
    started = time.monotonic()
    try:
        where, built = build(force=force)
    except NativeBuildError as exc:
        typer.echo(f"grid: error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from exc
    took = round(time.monotonic() - started, 1)
    if as_json:
        typer.echo(json.dumps({"path": str(where), "built": built, "seconds": took}))
    else:
        what = f"built in {took} s" if built else "already current"
        typer.echo(f"grid: native planner {what}: {where}")


if __name__ == "__main__":
    typer.run(main)
