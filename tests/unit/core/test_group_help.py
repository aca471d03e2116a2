"""Group help promises only what the group's commands do."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

GRID_BIN = Path(sys.executable).parent / "grid"


def test_engine_help_does_not_promise_missing_commands() -> None:
    r = subprocess.run(
        [str(GRID_BIN), "engine", "--help"], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    # The only engine command is 'install'; the summary must not offer an inspect verb.
    assert "install" in r.stdout
    assert "inspect" not in r.stdout.lower()


def _commands(cmd: Any, path: str = "grid") -> list[tuple[str, Any]]:
    out = [(path, cmd)]
    for name, sub in getattr(cmd, "commands", {}).items():
        out += _commands(sub, f"{path} {name}")
    return out


def test_no_command_help_shows_docstring_cross_reference_markup() -> None:
    # Command help comes from docstrings: a Sphinx role such as :data:`NAME` would reach the
    # operator as literal markup naming a constant they cannot see.
    import typer

    from grid_core.cli import build_app

    root = typer.main.get_command(build_app())
    leaks = [
        path
        for path, cmd in _commands(root)
        for text in (cmd.help or "", *(getattr(p, "help", None) or "" for p in cmd.params))
        if re.search(r":(data|func|class|meth|attr|mod):`", text)
    ]
    assert len(_commands(root)) > 50  # the walk reached every group's commands
    assert leaks == []


def test_every_grid_option_says_it_takes_a_grid_name_and_the_chosen_default() -> None:
    # Every command resolves --grid the same way (a URL, a configured name, 'local'; omitted:
    # the grid 'grid grids use' chose), so every command's help must say so; a help that
    # offered only a URL or claimed 'local' as the default hid the named grids.
    import typer

    from grid_core.cli import build_app

    root = typer.main.get_command(build_app())
    helps = {
        path: p.help
        for path, cmd in _commands(root)
        for p in cmd.params
        if "--grid" in getattr(p, "opts", ())
    }
    assert {"grid chat", "grid allocator model show", "grid keys list", "grid join"} <= set(helps)
    wrong = {
        path: text
        for path, text in helps.items()
        if "grid name" not in (text or "") or "'grid grids use'" not in (text or "")
    }
    assert wrong == {}


def test_no_command_help_holds_a_placeholder_markdown_drops() -> None:
    # Help is rendered as Markdown, where '<model id>' or '<commit>' reads as an HTML tag and
    # vanishes: 'ollama://<model id>' reached the operator as 'ollama://' (a code span keeps
    # it, as in ``--clear-<field>``).
    import typer

    from grid_core.cli import build_app

    root = typer.main.get_command(build_app())
    dropped = [
        (path, match.group())
        for path, cmd in _commands(root)
        for text in (cmd.help or "", *(getattr(p, "help", None) or "" for p in cmd.params))
        for match in re.finditer(r"<[A-Za-z/!][^>]*>", re.sub(r"`+[^`]*`+", "", text))
    ]
    assert dropped == []


def test_every_etcd_option_has_one_help_text_on_every_command() -> None:
    # `grid up` and `grid allocator state copy` both take the --etcd-* options; --etcd-key
    # once read "Its private key (0600)." on one and "Its private key." on the other, so an
    # operator could not tell whether the mode mattered. One option, one help text.
    import typer

    from grid_core.cli import build_app

    root = typer.main.get_command(build_app())
    helps: dict[str, dict[str, str]] = {}
    for path, cmd in _commands(root):
        for p in cmd.params:
            for opt in getattr(p, "opts", ()):
                if opt.startswith("--etcd-"):
                    helps.setdefault(opt, {})[path] = p.help or ""
    assert {"--etcd-ca", "--etcd-cert", "--etcd-key", "--etcd-user", "--etcd-password-file"} <= set(
        helps
    )
    assert {"grid up", "grid allocator state copy"} <= set(helps["--etcd-key"])
    differing = {opt: by_cmd for opt, by_cmd in helps.items() if len(set(by_cmd.values())) != 1}
    assert differing == {}
    # Each help stands on its own: no "Its ..." that only reads right after another option.
    vague = {
        opt: text
        for opt, by_cmd in helps.items()
        for text in by_cmd.values()
        if text.startswith("Its ")
    }
    assert vague == {}
