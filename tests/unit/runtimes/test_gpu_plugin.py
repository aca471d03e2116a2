"""grid_gpu reads NVML through the pynvml module (here the FAKE binding from tests/fakes)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from fake_engines import FAKES
from grid_gpu.nvml import NvmlDevice, read_devices

from grid_core.testing import plugins_with
from grid_node.telemetry import backends_of


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("pynvml", FAKES / "nvml" / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    spec.loader.exec_module(module)
    return module


def test_devices_come_from_nvml(fake_nvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    devices = tmp_path / "devices.json"
    devices.write_text(
        json.dumps(
            [
                {"name": "NVIDIA A100-SXM4-80GB", "memory_total_mb": 81920, "memory_used_mb": 1024},
                {"name": "NVIDIA L4", "memory_total_mb": 23034, "memory_used_mb": 0},
            ]
        )
    )
    monkeypatch.setenv("FAKE_NVML_DEVICES", str(devices))
    assert read_devices() == [
        NvmlDevice(0, "NVIDIA A100-SXM4-80GB", 81920, 1024),
        NvmlDevice(1, "NVIDIA L4", 23034, 0),
    ]
    reported = plugins_with(builtins=("grid_gpu",)).gpu_devices()
    assert [d.memory_total_mb for d in reported] == [81920, 23034]
    assert {"cpu", "cuda"} <= set(backends_of(reported))


def test_no_driver_means_no_gpu_not_an_error(fake_nvml, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("FAKE_NVML_DEVICES", raising=False)
    assert read_devices() == []
    assert plugins_with(builtins=("grid_gpu",)).gpu_devices() == []
    assert "cuda" not in backends_of([])
