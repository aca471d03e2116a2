"""``grid allocator status`` (the table view) names the planner build the server runs."""

from __future__ import annotations

from rich.console import Console

from grid_server.cli_render import status_view


def _text(server: dict) -> str:
    console = Console(width=200, record=True)
    console.print(status_view({"mode": "automatic", "server": server}))
    return console.export_text()


def test_status_names_the_planner_build_and_why_it_is_interpreted() -> None:
    native = {"native": True, "reason": "native: mypyc build in /venv/grid-native/x"}
    assert "planner: native" in _text({"planner_build": native})
    why = "interpreted: no native build for these sources; build it with 'make native'"
    assert f"planner: {why}" in _text({"planner_build": {"native": False, "reason": why}})
    assert "planner:" not in _text({})  # an older server reports no build
