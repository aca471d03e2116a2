"""docs/plugins.md lists exactly the built-in placement score terms ``grid_scoring`` registers."""

from __future__ import annotations

import re
from pathlib import Path

from grid_scoring.plugin import TERMS

ROOT = Path(__file__).resolve().parents[3]


def test_documented_builtin_score_terms_are_the_registered_ones() -> None:
    text = " ".join((ROOT / "docs" / "plugins.md").read_text().split())
    listed = re.search(r"Built-in defaults: `grid_scoring` \(([^)]*)\)", text)
    assert listed is not None, "docs/plugins.md no longer lists the built-in score terms"
    documented = {name.strip().replace(" ", "_") for name in listed.group(1).split(",")}
    # An operator writing a term reads this list to know what it adds to or replaces.
    assert documented == {term.name for term in TERMS}
