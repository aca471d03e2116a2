"""A node offers the runtimes its configuration names (a media node: only ``comfyui``)."""

from __future__ import annotations

import pytest

from grid_core.errors import ValidationError
from grid_core.nodeconfig import NodeConfig
from grid_core.plugins import get_plugins
from grid_node.agent import offered_adapters


def test_offered_runtimes_are_the_configured_subset_of_the_installed_plugins(tmp_path):
    installed = get_plugins().runtime_adapters()
    assert {"llama.cpp", "vllm", "ollama", "comfyui"} <= set(installed)
    assert offered_adapters(installed, ()) == installed
    media = NodeConfig(state_dir=tmp_path, runtimes=("comfyui",))
    assert list(offered_adapters(installed, media.runtimes)) == ["comfyui"]
    with pytest.raises(ValidationError, match=r"runtimes \(--runtime\) sglang: no such runtime"):
        offered_adapters(installed, ("comfyui", "sglang"))
