"""The scenario lab speaks the real plugins' names: every runtime its catalog and machine
classes use (llama.cpp, vllm, comfyui, …) is a runtime adapter a built-in plugin registers,
so a lab finding about "comfyui" capacity is a finding about the real ComfyUI plugin."""

from __future__ import annotations

from grid_core.scenario.catalog import CATALOG_SIZE, build_catalog
from grid_core.scenario.topology import CLASSES
from grid_core.testing import builtin_entry_points, plugins_with


def test_every_lab_runtime_is_a_built_in_adapter() -> None:
    builtins = tuple(ep.name for ep in builtin_entry_points())
    adapters = set(plugins_with(builtins=builtins).runtime_adapters())
    catalog = {rt for e in build_catalog(CATALOG_SIZE) for rt in e.profile.runtimes}
    machines = {rt for kind in CLASSES for rt in kind.runtimes}
    assert {"llama.cpp", "vllm", "comfyui"} <= catalog | machines
    assert catalog | machines <= adapters, (catalog | machines) - adapters
