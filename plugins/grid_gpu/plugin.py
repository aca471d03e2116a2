"""Entry point of the grid_gpu plugin: ``grid_gpu_devices`` from NVML."""

from __future__ import annotations

from collections.abc import Callable

from grid_core.api import GpuDevice, hookimpl
from grid_gpu.nvml import read_devices


@hookimpl(trylast=True)
def grid_gpu_devices(register: Callable[[GpuDevice], None]) -> None:
    """Register every NVIDIA GPU of this host (none without a driver; never an error)."""
    for device in read_devices():
        register(device)
