"""README.md leads a new operator to every page under docs/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_readme_links_every_docs_page() -> None:
    # A page the README does not link (deployment on several machines, runtimes, ...) is
    # found only by someone who already knows it exists.
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", (ROOT / "README.md").read_text()))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set()
    assert linked - pages == set()  # and every link leads to a page
