"""The public plugin API loads each name on first use, and every public name still resolves.

A command-line start imports only what the command needs: ``grid --help`` must not pay for the
controller, the ASGI server, the HTTP client stack of the engine gateway or the X.509 library.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grid_core.api as api

HEAVY = ("aiohttp", "uvicorn", "cryptography", "litestar", "grid_core.controller")
"""Modules a CLI start that only lists commands has no use for."""


def _type_checking_imports() -> dict[str, tuple[str, str]]:
    tree = ast.parse(Path(api.__file__).read_text())
    [block] = [n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n)]
    return {
        alias.asname or alias.name: (node.module or "", alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_the_lazy_table_matches_the_type_checking_imports() -> None:
    assert _type_checking_imports() == api._SOURCES


def test_every_public_name_resolves_to_its_source_object() -> None:
    import importlib

    for name in api.__all__:
        value = getattr(api, name)
        if name in api._SOURCES:
            module, attribute = api._SOURCES[name]
            assert value is getattr(importlib.import_module(module), attribute), name
    assert set(api._SOURCES) <= set(api.__all__)


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    try:
        api.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("an unknown public name resolved")


def test_grid_help_does_not_import_the_heavy_stacks() -> None:
    probe = (
        "import sys\n"
        "sys.argv = ['grid', '--help']\n"
        "from grid_core.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('LOADED=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert "Usage" in out.stdout
    [loaded] = [line for line in out.stdout.splitlines() if line.startswith("LOADED=")]
    assert loaded == "LOADED=", f"grid --help imported {loaded.removeprefix('LOADED=')}"
