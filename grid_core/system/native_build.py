"""Build the planner's native modules with mypyc (:mod:`grid_core.native`).

Run as ``python -m grid_core.system.native_build`` (``make native`` does, and ``make demo``,
``make test``, ``make check`` and ``make bench`` through it). Nothing is built when a
complete build of the current sources exists. Otherwise the ``grid_core`` sources are copied
to a temporary directory beside the final one and compiled there (the same way from a git
checkout and from an installed package), and the result is moved into place only when
complete (its manifest, with every file's size, is written last). One build runs at a time
per environment (a file lock); a build that finds a complete one made meanwhile keeps it.
Only the most recently used builds are kept (:data:`BUILDS_KEPT`). Needs mypy (the ``dev``
or ``native`` extra), setuptools, a C compiler and Python's headers.

Exit codes: 0 built or already current; 1 the build failed (mypyc's and the compiler's
output is shown); 2 mypy or setuptools is not installed; 143 stopped by SIGTERM (the compile
with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import psutil
import typer
from filelock import FileLock, Timeout

from grid_core import native
from grid_core.system.identity import is_gone

BUILD_TIMEOUT_S = 1800.0
"""Seconds the mypyc build may take: about 55 s on a quiet 2-core machine and 100-200 s on a
busy one; a generous bound so a loaded machine still finishes, while a stuck compiler does
not hang ``make`` for ever."""
LOCK_WAIT_S = BUILD_TIMEOUT_S
"""Seconds a build waits for another one in the same environment to finish."""
LOCK_NAME = ".build.lock"
"""The lock file under the native root that lets one build run at a time."""
STOP_GRACE_S = 5.0
"""Seconds the compile has to exit after SIGTERM before what is left of it is killed, and
again for the killed processes to be gone."""
STOP_POLL_S = 0.01
"""Seconds between checks that the killed processes of the compile are gone."""
BUILDS_KEPT = 4
"""Native builds kept per interpreter (about 4 MB each): the current one and the most
recently used others, so switching between a few branches or checkouts that share one
environment does not rebuild every time."""
OPT_LEVEL = "3"
"""The C compiler's optimisation level for the compiled modules (mypyc's default)."""
MYPY_CONFIG = "[mypy]\nignore_missing_imports = True\n"
"""mypy's configuration for the compile: types are checked by ``make lint``; here only
modules without type information must not stop the build."""
COMPILER_HINT = "it needs a C compiler (gcc or clang) and Python's headers (python3-dev)"
"""Said after a failed compile: the two things a machine most often lacks."""
TERMINATED_EXIT = 143
"""Exit status after SIGTERM (128 + 15), once the compile is stopped and cleaned up."""

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


def is_current() -> bool:
    """Whether a complete native build of the current sources exists."""
    return native.check_build(native.build_dir(native.source_digest())) is None


def build(
    *,
    force: bool = False,
    on_wait: Callable[[Path], None] | None = None,
    on_compile: Callable[[], None] | None = None,
) -> tuple[Path, bool]:
    """Build the native planner for the current sources unless a complete build exists.

    Args:
        force: rebuild even when a complete build of these sources exists.
        on_wait: called with the lock file's path when another build holds it, before
            waiting for it (at most :data:`LOCK_WAIT_S`).
        on_compile: called when the compile starts (not when a build is kept).

    Returns:
        ``(build directory, built)``: ``built`` is False when an existing build was kept.

    Raises:
        MissingToolError: mypy or setuptools is missing.
        NativeBuildError: the compile failed or took more than :data:`BUILD_TIMEOUT_S`, or
            another build held the lock for more than :data:`LOCK_WAIT_S` (the message
            carries the compiler's output tail).
    """
    for needed in ("mypyc.build", "setuptools"):
        try:
            __import__(needed)
        except ImportError as exc:
            msg = f"{needed} is not installed ({exc}); install Grid's 'dev' or 'native' extra"
            raise MissingToolError(msg) from exc
    digest = native.source_digest()
    final = native.build_dir(digest)
    if native.check_build(final) is None and not force:
        native.touch(final)  # needs no lock, so a read-only environment is "current" too
        return final, False
    root = native.native_root()
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(root / LOCK_NAME)
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if on_wait is not None:
                on_wait(root / LOCK_NAME)
            lock.acquire(timeout=LOCK_WAIT_S)
    except Timeout as exc:
        msg = f"another native build held {root / LOCK_NAME} for {LOCK_WAIT_S:.0f} s"
        raise NativeBuildError(msg) from exc
    try:
        if native.check_build(final) is None and not force:
            native.touch(final)  # built by the build this one waited for
            return final, False
        _remove_older(root, keep=final)  # first: leftovers of stopped builds go too
        if on_compile is not None:
            on_compile()
        _compile(final, digest)
        _remove_older(root, keep=final)
    finally:
        lock.release()
    return final, True


def _compile(final: Path, digest: str) -> None:
    """Compile a copy of the ``grid_core`` sources and move the build to ``final``.

    Raises:
        NativeBuildError: the compile failed, or the sources changed meanwhile.
    """
    modules = native.compiled_modules()
    core = Path(native.__file__).resolve().parent
    with tempfile.TemporaryDirectory(prefix=".building-", dir=final.parent) as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(core, src / "grid_core", ignore=_not_source)
        (src / "mypy.ini").write_text(MYPY_CONFIG)
        if native.source_digest(src / "grid_core") != digest:
            msg = "grid_core's sources changed during the build; run it again"
            raise NativeBuildError(msg)
        staging = Path(tmp) / "lib"
        paths = ",".join(f"grid_core/planner/{m}" for m in modules)
        dirs = [f"{tmp}/c", str(staging), f"{tmp}/t"]
        _run([sys.executable, "-c", _SETUP, paths, *dirs, OPT_LEVEL], src)
        native.write_manifest(staging, modules)
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)


def _not_source(folder: str, names: list[str]) -> set[str]:
    """``copytree`` filter: only Python sources and the folders that hold them."""
    return {n for n in names if n == "__pycache__" or ("." in n and not n.endswith(".py"))}


def _run(argv: list[str], cwd: Path) -> None:
    """Run the mypyc build in ``cwd`` (the directory holding the copy of ``grid_core``, so
    module names match paths), in a session of its own: when this stops early (timeout,
    SIGTERM, Ctrl-C), nothing of the compile (setuptools, the C compiler) is left running
    (:func:`_stop_session`).

    Raises:
        NativeBuildError: non-zero exit or timeout, with the output's last lines.
    """
    with subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as child:
        try:
            out, _ = child.communicate(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            _stop_session(child)
            msg = f"the mypyc build took more than {BUILD_TIMEOUT_S:.0f} s and was stopped"
            raise NativeBuildError(msg) from exc
        except BaseException:
            _stop_session(child)
            raise
    if child.returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-30:])
        msg = f"the mypyc build failed (exit {child.returncode}; {COMPILER_HINT}):\n{tail}"
        raise NativeBuildError(msg)


def _stop_session(child: subprocess.Popen[str]) -> None:
    """Stop every process of the session ``child`` leads (the compile started it with
    ``start_new_session``, so that session holds only the compile's processes): SIGTERM,
    :data:`STOP_GRACE_S` for ``child`` to exit, then SIGKILL for whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    _wait_gone(child.pid, STOP_GRACE_S)


def _wait_gone(group: int, bound_s: float) -> None:
    """Wait (at most ``bound_s`` seconds) until no process of process group ``group`` runs:
    each is gone or a zombie (:func:`~grid_core.system.identity.is_gone`). A killed grandchild
    of the compile (the C compiler, reparented once setuptools exits) may still be running for
    a moment after the signal; returning only when it is not means a stopped build has really
    stopped."""
    members = []
    for pid in psutil.pids():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == group:
                members.append(pid)
    end = time.monotonic() + bound_s
    while members and time.monotonic() < end:
        members = [pid for pid in members if not is_gone(pid)]
        if members:
            time.sleep(STOP_POLL_S)


def _remove_older(root: Path, keep: Path) -> None:
    """Keep ``keep`` and this interpreter's :data:`BUILDS_KEPT` - 1 most recently used other
    builds (another branch or checkout sharing the environment reuses its own); remove the
    rest and every temporary build directory (called with the build lock held, so none of
    those belongs to a running build)."""
    tag = f"{sys.implementation.cache_tag}-"
    others = [e for e in root.iterdir() if e != keep and e.is_dir() and e.name.startswith(tag)]
    others.sort(key=lambda e: e.stat().st_mtime, reverse=True)
    stale = others[BUILDS_KEPT - 1 :]
    stale += [e for e in root.iterdir() if e.name.startswith(".building-") and e.is_dir()]
    for entry in stale:
        shutil.rmtree(entry, ignore_errors=True)


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM: leave through ``SystemExit`` so the compile child is stopped, the temporary
    directory removed and the lock released on the way out."""
    raise SystemExit(TERMINATED_EXIT)


def main(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when current.")] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="One JSON object on stdout: path, built and seconds; error (and no path) "
            "when the build failed.",
        ),
    ] = False,
) -> None:
    """Build the planner's native (mypyc) modules for the current sources; a no-op when a
    complete build of them exists."""
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()

    def compiling() -> None:
        if not as_json:
            typer.echo("grid: building the native planner with mypyc (a minute or two) ...")

    def waiting(lock: Path) -> None:
        typer.echo(f"grid: waiting for another native build to finish ({lock})", err=True)

    try:
        where, built = build(force=force, on_wait=waiting, on_compile=compiling)
    except (NativeBuildError, OSError) as exc:
        code = exc.exit_code if isinstance(exc, NativeBuildError) else 1
        if as_json:
            typer.echo(json.dumps({"error": str(exc), "built": False}))
        typer.echo(f"grid: error: {exc}", err=True)
        raise typer.Exit(code) from exc
    took = round(time.monotonic() - started, 1)
    if as_json:
        typer.echo(json.dumps({"path": str(where), "built": built, "seconds": took}))
    else:
        what = f"built in {took} s" if built else "already current"
        typer.echo(f"grid: native planner {what}: {where}")


if __name__ == "__main__":
    typer.run(main)
