"""Entry point of the grid_ollama plugin: the ``ollama`` runtime adapter."""

from __future__ import annotations

from collections.abc import Callable

from grid_core.api import RuntimeAdapter, hookimpl


@hookimpl(trylast=True)
def grid_runtime_adapters(register: Callable[[RuntimeAdapter], None]) -> None:
    """Register the Ollama adapter (service from ``$GRID_OLLAMA_URL``, loopback only).

    A default (``trylast``): a plugin registering its own ``ollama`` adapter replaces it.
    """
    from grid_ollama.adapter import OllamaAdapter

    register(OllamaAdapter())
