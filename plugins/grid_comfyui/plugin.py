"""Entry point of the grid_comfyui plugin: the ``comfyui`` runtime adapter."""

from __future__ import annotations

from collections.abc import Callable

from grid_core.api import RuntimeAdapter, hookimpl


@hookimpl(trylast=True)
def grid_runtime_adapters(register: Callable[[RuntimeAdapter], None]) -> None:
    """Register the ComfyUI adapter (server from ``$GRID_COMFYUI_URL``, loopback only).

    A default (``trylast``): a plugin registering its own ``comfyui`` adapter replaces it.
    """
    from grid_comfyui.adapter import ComfyUIAdapter

    register(ComfyUIAdapter())
