"""The plugin's entry point (``[project.entry-points.grid] grid_echo = "grid_echo.plugin"``)."""

from __future__ import annotations

from collections.abc import Callable

from grid_core.api import RuntimeAdapter, hookimpl
from grid_echo.adapter import EchoAdapter


@hookimpl
def grid_runtime_adapters(register: Callable[[RuntimeAdapter], None]) -> None:
    """Provide the ``echo`` runtime."""
    register(EchoAdapter())
