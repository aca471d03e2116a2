"""FAKE NVML binding for tests: importable as ``pynvml`` in place of ``nvidia-ml-py``.

A test puts this directory first on ``PYTHONPATH`` of a node process and names a JSON file in
``FAKE_NVML_DEVICES``: a list of ``{"name", "memory_total_mb", "memory_used_mb"}``. Without
that variable the fake behaves like a machine without an NVIDIA driver: ``nvmlInit`` raises
``NVMLError_LibraryNotFound``, as the real binding does when ``libnvidia-ml.so.1`` is absent.
Only the calls Grid's GPU plugin makes exist here, with the real binding's names and types
(memory in bytes; ``nvmlDeviceGetName`` returns ``str`` as nvidia-ml-py 12+ does).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_LIBRARY_NOT_FOUND = 12
MIB = 1024 * 1024

_devices: list[dict] | None = None


class NVMLError(Exception):
    """The real binding's base error; ``value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            NVML_ERROR_UNINITIALIZED: "Uninitialized",
            NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
            NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        }.get(self.value, f"NVML error {self.value}")


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


@dataclass
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


def nvmlInit() -> None:
    global _devices
    path = os.environ.get("FAKE_NVML_DEVICES")
    if not path:
        raise NVMLError_LibraryNotFound()
    with open(path) as f:
        _devices = json.load(f)


def nvmlShutdown() -> None:
    global _devices
    _devices = None


def _all() -> list[dict]:
    if _devices is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _devices


def nvmlDeviceGetCount() -> int:
    return len(_all())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < len(_all()):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return str(_all()[handle]["name"])


def nvmlDeviceGetMemoryInfo(handle: int) -> c_nvmlMemory_t:
    d = _all()[handle]
    total = int(d["memory_total_mb"]) * MIB
    used = int(d.get("memory_used_mb", 0)) * MIB
    return c_nvmlMemory_t(total=total, free=total - used, used=used)


def nvmlSystemGetDriverVersion() -> str:
    _all()
    return "0.0-fake"
