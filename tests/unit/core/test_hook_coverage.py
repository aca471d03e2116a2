"""Every hook specification is documented and exercised by at least one test."""

from __future__ import annotations

import inspect
from pathlib import Path

from grid_core import hookspecs

ROOT = Path(__file__).parents[3]


def _hook_names() -> list[str]:
    return [
        name
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if name.startswith("grid_")
    ]


def test_every_hook_is_in_the_architecture_doc() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = [h for h in _hook_names() if f"`{h}(" not in doc]
    assert missing == [], f"document these hooks in docs/architecture.md: {missing}"


def test_every_hook_is_named_by_some_test() -> None:
    texts = [
        p.read_text() for p in (ROOT / "tests").rglob("test_*.py") if p.name != Path(__file__).name
    ]
    corpus = "\n".join(texts)
    missing = [h for h in _hook_names() if h not in corpus]
    assert missing == [], f"write a test exercising these hooks: {missing}"


def test_every_hook_has_a_docstring() -> None:
    for name in _hook_names():
        assert (getattr(hookspecs, name).__doc__ or "").strip(), name
