"""Entry point of the grid_vllm plugin: the ``vllm`` runtime adapter."""

from __future__ import annotations

from collections.abc import Callable

from grid_core.api import RuntimeAdapter, hookimpl


@hookimpl(trylast=True)
def grid_runtime_adapters(register: Callable[[RuntimeAdapter], None]) -> None:
    """Register the vLLM adapter (executable from ``$GRID_VLLM`` or PATH).

    A default (``trylast``): a plugin registering its own ``vllm`` adapter replaces it.
    """
    from grid_vllm.adapter import VllmAdapter

    register(VllmAdapter())
