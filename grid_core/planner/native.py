"""The planner's native build: the same modules compiled to C extensions by mypyc, used when
a build made from exactly these sources exists, the interpreted modules otherwise.

mypyc (part of mypy) compiles type-annotated Python to C. It changes no decision: the same
source runs, with its annotations checked at run time, so plans are byte-identical
(``tests/unit/planner/test_planner_native.py`` compares both builds on the named fleets).
It makes a plan 1.6-2.2x faster (``docs/planner.md``, "Native build").

A build lives in ``<sys.prefix>/grid-native/<interpreter tag>-<source digest>/`` (in the
virtual environment ``make`` creates: ``.venv/grid-native/``). The digest covers every
``grid_core`` source file, because mypyc reads the types and ``Final`` constants of every
module the planner imports; after any edit the build no longer matches and the planner runs
interpreted until it is rebuilt (``make native``, or ``python -m grid_core.system.native_build``).
A stale build is never loaded.

This module runs interpreted in every case (it is what decides), as do the package's
``__init__`` and the modules listed in :data:`INTERPRETED`.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

NATIVE_ENV = "GRID_PLANNER_NATIVE"
"""Set to ``0`` to run the interpreted planner even when a current native build exists
(to debug, profile in Python, or compare the two builds)."""
NATIVE_DIR_NAME = "grid-native"
"""Directory under ``sys.prefix`` that holds native builds, one per source digest."""
MANIFEST_NAME = "manifest.txt"
"""Written last by a build, one compiled module per line: a build without it is incomplete."""
DIGEST_CHARS = 20
"""Hex characters of the source digest kept in a build's directory name (80 bits)."""
INTERPRETED = frozenset(
    {
        # the loader and the package entry (orchestration; tests replace its steps)
        "__init__",
        "native",
        # msgspec Structs: mypyc would drop their class options (frozen, kw_only)
        "types",
        "explain",
        "preemption",
        "scoring",
        # the public hooks dataclass: compiled, it would reject a list where a tuple is typed
        "hooks",
        # the exact optimum: its time goes to HiGHS, and tests replace its steps
        "exact",
        "exactrows",
    }
)
"""Planner modules that are never compiled, with the reason for each."""

_PACKAGE_DIR = Path(__file__).resolve().parent
_CORE_DIR = _PACKAGE_DIR.parent


@dataclass(frozen=True)
class NativeStatus:
    """Which planner build this process runs.

    Attributes:
        active: True when the compiled modules are in use.
        reason: one line for an operator: where the build came from, or why the interpreted
            planner runs and how to build the native one.
        path: the build directory in use (``None`` when interpreted).
    """

    active: bool
    reason: str
    path: Path | None = None


def compiled_modules() -> list[str]:
    """The planner modules a native build compiles, as file names (``core.py``, …), sorted."""
    return sorted(p.name for p in _PACKAGE_DIR.glob("*.py") if p.stem not in INTERPRETED)


def source_digest(core_dir: Path = _CORE_DIR) -> str:
    """SHA-256 (hex) over every ``*.py`` under ``core_dir`` (the ``grid_core`` package): each
    file's path relative to ``core_dir`` and its bytes, in sorted path order."""
    digest = hashlib.sha256()
    for path in sorted(core_dir.rglob("*.py")):
        rel = path.relative_to(core_dir).as_posix()
        digest.update(rel.encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def native_root() -> Path:
    """``<sys.prefix>/grid-native``: where native builds of this environment live."""
    return Path(sys.prefix) / NATIVE_DIR_NAME


def build_dir(digest: str) -> Path:
    """The directory of the native build for ``digest`` under this interpreter."""
    return native_root() / f"{sys.implementation.cache_tag}-{digest[:DIGEST_CHARS]}"


def activate(package_path: list[str]) -> NativeStatus:
    """Use the native build for the current sources when one exists and is complete: load its
    shared runtime library and put its package directory first on ``package_path`` (the
    planner package's ``__path__``), so the compiled modules are imported instead of the
    source ones. Never raises: any problem leaves the interpreted planner in use and is named
    in the returned status."""
    if os.environ.get(NATIVE_ENV, "").strip() == "0":
        return NativeStatus(False, f"interpreted: turned off by {NATIVE_ENV}=0")
    try:
        where = build_dir(source_digest())
        manifest = where / MANIFEST_NAME
        if not manifest.is_file():
            why = "no native build for these sources"
            return NativeStatus(False, f"interpreted: {why}; build one with 'make native'")
        _load_runtime(where, manifest.read_text().split())
    except (OSError, ImportError) as exc:
        return NativeStatus(False, f"interpreted: the native build could not be loaded ({exc})")
    package_path.insert(0, str(where / "grid_core" / "planner"))
    return NativeStatus(True, f"native: mypyc build in {where}", where)


def _load_runtime(where: Path, listed: list[str]) -> None:
    """Check every compiled module of the manifest is present, then import the build's shared
    runtime library (``*__mypyc*``: the compiled code of all modules, which each module's
    small extension imports by its top-level name) without adding ``where`` to ``sys.path``.

    Raises:
        ImportError: a listed module or the runtime library is missing.
    """
    planner_dir = where / "grid_core" / "planner"
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    present = {p.name.split(".")[0] for p in planner_dir.iterdir() if p.name.endswith(suffixes)}
    missing = sorted(Path(m).stem for m in listed if Path(m).stem not in present)
    if missing:
        msg = f"compiled modules missing from {planner_dir}: {', '.join(missing)}"
        raise ImportError(msg)
    runtimes = [p for p in where.iterdir() if "__mypyc" in p.name and p.name.endswith(suffixes)]
    if len(runtimes) != 1:
        msg = f"expected one mypyc runtime library in {where}, found {len(runtimes)}"
        raise ImportError(msg)
    name = runtimes[0].name.split(".")[0]
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, runtimes[0])
    if spec is None or spec.loader is None:
        msg = f"cannot load {runtimes[0]}"
        raise ImportError(msg)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
