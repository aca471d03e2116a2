"""The operations guide describes what ``make demo`` really runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_demo_section_names_the_makefile_demo_commands() -> None:
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    commands = set(re.findall(r"grid (test (?:start|demo|stop))", recipe))
    assert commands, "the demo target runs grid commands"
    doc = (ROOT / "docs" / "operations.md").read_text()
    section = doc.split("## Demo", 1)[1].split("\n## ", 1)[0]
    for command in commands:
        assert f"grid {command}" in section
    for module in re.findall(r"python -m ([\w.]+)", section):
        assert module in recipe, f"docs claim make demo runs {module}"
