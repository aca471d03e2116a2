"""``grid plugins`` lists the three runtime plugins and the GPU plugin, loaded from the
``grid`` entry points like any third-party plugin, with the hooks they implement."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_grid_plugins_lists_the_runtime_and_gpu_plugins_from_entry_points(tmp_path) -> None:
    env = dict(os.environ, GRID_HOME=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", "plugins", "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    loaded = {p["name"]: p for p in json.loads(out.stdout)["plugins"]}
    for name in ("grid_vllm", "grid_ollama", "grid_comfyui"):
        assert loaded[name]["hooks"] == ["grid_runtime_adapters"], loaded[name]
        assert loaded[name]["distribution"] == "grid"
    assert loaded["grid_gpu"]["hooks"] == ["grid_gpu_devices"]
