"""Read this host's NVIDIA GPUs from NVML through ``nvidia-ml-py`` (module ``pynvml``).

A host without the NVIDIA driver (no ``libnvidia-ml``) has no GPU: that is an answer, not an
error. Only a failure after NVML initialised (a device that cannot be read) is reported, as
one device missing from the list, because placement must never count memory it cannot see
(specification, "Current limits": device count and per-device VRAM are preserved and
``min_gpu_count``/``min_gpu_memory_mb`` fail closed).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

MB = 1024 * 1024


@dataclass
class NvmlDevice:
    """One NVIDIA GPU (a :class:`grid_core.api.GpuDevice`).

    Attributes:
        index: NVML device index.
        name: product name (``NVIDIA A100-SXM4-80GB``).
        memory_total_mb: framebuffer memory in MB.
        memory_used_mb: memory in use now in MB.
        backend: the compute backend the device offers (``cuda``); the node reports it in
            its resources, so profiles that need CUDA can be placed here.
    """

    index: int
    name: str
    memory_total_mb: int
    memory_used_mb: int | None
    backend: str = "cuda"


def read_devices() -> list[NvmlDevice]:
    """Every GPU NVML reports; empty without an NVIDIA driver or the binding."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []  # no driver / library: this host has no NVIDIA GPU
    devices: list[NvmlDevice] = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                name = pynvml.nvmlDeviceGetName(handle)
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError:
                continue  # an unreadable device is not counted as capacity
            if isinstance(name, bytes):  # nvidia-ml-py before 11.5 returned bytes
                name = name.decode(errors="replace")
            devices.append(
                NvmlDevice(
                    index=index,
                    name=str(name),
                    memory_total_mb=int(mem.total) // MB,
                    memory_used_mb=int(mem.used) // MB,
                )
            )
    except pynvml.NVMLError:
        return []
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return devices
