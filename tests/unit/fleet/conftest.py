"""Shared fixtures of the logical fleet's unit tests."""

from __future__ import annotations

import pytest
from grid_fleet import layout


@pytest.fixture
def usable(monkeypatch: pytest.MonkeyPatch) -> int:
    """This machine's usable memory, fixed at 20,000 MB for the split arithmetic."""
    monkeypatch.setattr(layout, "usable_memory_mb", lambda: 20_000)
    return 20_000
