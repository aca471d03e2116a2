"""The planner's native build: the planner modules compiled to C extensions by mypyc, used
when a complete build made from exactly these sources exists, the interpreted modules
otherwise.

mypyc (part of mypy) compiles type-annotated Python to C. It changes no decision: the same
source runs, with its annotations checked at run time, so plans are byte-identical
(``tests/unit/planner/test_planner_native.py`` compares both builds). It makes a plan
1.6-2.2x faster (``docs/planner.md``, "Native build").

A build lives in ``<sys.prefix>/grid-native/<interpreter tag>-<source digest>/`` (in the
virtual environment ``make`` creates: ``.venv/grid-native/``). The digest covers every
``grid_core`` source file, because mypyc reads the types and ``Final`` constants of every
module the planner imports; after any edit the build no longer matches and the planner runs
interpreted until it is rebuilt (:data:`BUILD_HINT`). A stale build is never loaded, nor
one whose files are missing or have another size than the build recorded (a truncated
shared library would crash the process that maps it).

This module is outside :mod:`grid_core.planner` so that the builder
(:mod:`grid_core.system.native_build`) can use it without loading a build; it imports only
the standard library. The planner package calls :func:`activate` before importing anything
else of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

NATIVE_ENV = "GRID_PLANNER_NATIVE"
"""``0`` (or ``false``, ``no``, ``off``) runs the interpreted planner even when a current
native build exists: to debug, profile in Python, or compare the two builds."""
OFF_VALUES = frozenset({"0", "false", "no", "off"})
"""Values of :data:`NATIVE_ENV` that turn the native build off (any case)."""
ON_VALUES = frozenset({"", "1", "true", "yes", "on"})
"""Values of :data:`NATIVE_ENV` that leave it on; any other value is named in the status."""
NATIVE_DIR_NAME = "grid-native"
"""Directory under ``sys.prefix`` that holds native builds, one per source digest."""
MANIFEST_NAME = "manifest.json"
"""Written last by a build: the compiled modules and the size of every file of the build. A
build without it is incomplete."""
DIGEST_CHARS = 20
"""Hex characters of the source digest kept in a build's directory name (80 bits)."""
PACKAGE = "grid_core.planner"
"""The package whose modules a native build compiles."""
BUILD_HINT = "build it with 'make native' or 'python -m grid_core.system.native_build'"
"""How to (re)build, for the reasons this module gives."""
INTERPRETED = frozenset(
    {
        # the package entry (orchestration; tests replace its steps)
        "__init__",
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

_CORE_DIR = Path(__file__).resolve().parent
_PLANNER_DIR = _CORE_DIR / "planner"


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
    return sorted(p.name for p in _PLANNER_DIR.glob("*.py") if p.stem not in INTERPRETED)


def source_digest(core_dir: Path = _CORE_DIR) -> str:
    """SHA-256 (hex) over every ``*.py`` under ``core_dir`` (the ``grid_core`` package): each
    file's path relative to ``core_dir`` and its bytes, in sorted path order (about 4 ms)."""
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


def write_manifest(where: Path, modules: list[str]) -> None:
    """Record ``modules`` and the size of every file under ``where`` in its manifest (the
    builder's last step)."""
    files = {
        p.relative_to(where).as_posix(): p.stat().st_size
        for p in sorted(where.rglob("*"))
        if p.is_file()
    }
    doc = {"modules": modules, "files": files}
    (where / MANIFEST_NAME).write_text(json.dumps(doc, indent=1) + "\n")


def check_build(where: Path) -> str | None:
    """Why the build in ``where`` cannot be used (``None``: it is complete): no manifest, a
    compiled module the manifest lists without its file, or a file missing or of another size
    than the manifest records."""
    try:
        doc = json.loads((where / MANIFEST_NAME).read_text())
        modules, files = list(doc["modules"]), dict(doc["files"])
    except FileNotFoundError:
        return "no native build for these sources"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"the native build's manifest is unreadable ({exc})"
    planner_dir = f"{PACKAGE.replace('.', '/')}/"
    listed = {Path(name).name.split(".")[0] for name in files if name.startswith(planner_dir)}
    absent = sorted(Path(m).stem for m in modules if Path(m).stem not in listed)
    if absent:
        return f"compiled modules missing from the native build: {', '.join(absent)}"
    for name, size in files.items():
        try:
            actual = (where / name).stat().st_size
        except OSError:
            return f"the native build lacks {name}"
        if actual != size:
            return f"the native build's {name} is {actual} bytes, not {size} (damaged)"
    return None


def activate(package_path: list[str]) -> NativeStatus:
    """Use the native build for the current sources when one exists and is complete: load its
    shared runtime library, put its package directory first on ``package_path`` (the
    planner package's ``__path__``) and import every compiled module, so that the package
    imports them instead of the source ones. Never raises: any problem leaves the
    interpreted planner in use (nothing of the build stays imported) and is named in the
    returned status."""
    setting = os.environ.get(NATIVE_ENV, "").strip().lower()
    if setting in OFF_VALUES:
        return NativeStatus(False, f"interpreted: turned off by {NATIVE_ENV}={setting}")
    note = "" if setting in ON_VALUES else f" ({NATIVE_ENV}={setting!r} not understood)"
    try:
        where = build_dir(source_digest())
        why = check_build(where)
        if why is not None:
            return NativeStatus(False, f"interpreted: {why}; {BUILD_HINT}{note}")
        _load_runtime(where)
        stems = [Path(m).stem for m in compiled_modules()]
        _import_compiled(PACKAGE, package_path, where / PACKAGE.replace(".", "/"), stems)
    except (OSError, ImportError) as exc:
        why = f"the native build could not be loaded ({exc}); rebuild it with --force"
        return NativeStatus(False, f"interpreted: {why}{note}")
    touch(where)
    return NativeStatus(True, f"native: mypyc build in {where}{note}", where)


def _load_runtime(where: Path) -> None:
    """Import the build's shared runtime library (``*__mypyc*``: the compiled code of all
    modules, which each module's small extension imports by its top-level name) without
    adding ``where`` to ``sys.path``.

    Raises:
        ImportError: the library is missing or does not load.
    """
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
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


def _import_compiled(
    package: str, package_path: list[str], pkg_dir: Path, stems: list[str]
) -> None:
    """Put ``pkg_dir`` (the build's copy of ``package``) first on ``package_path`` and import
    the modules ``stems`` of ``package`` now, so that a module that fails to load fails here,
    where it can be undone: then ``pkg_dir`` comes off the path again and every module of
    ``package`` imported since is forgotten, so the source modules load instead.

    Raises:
        ImportError: a module did not load (after the undo).
    """
    module = sys.modules[package]
    before = set(sys.modules)
    package_path.insert(0, str(pkg_dir))
    try:
        for stem in stems:
            importlib.import_module(f"{package}.{stem}")
    except BaseException:
        package_path.remove(str(pkg_dir))
        for name in set(sys.modules) - before:
            if name.startswith(f"{package}."):
                del sys.modules[name]
                vars(module).pop(name.rsplit(".", 1)[1], None)
        raise


def touch(where: Path) -> None:
    """Mark the build in ``where`` as used now (the builder keeps the most recently used
    builds); a read-only environment still runs the build."""
    with contextlib.suppress(OSError):
        os.utime(where)
