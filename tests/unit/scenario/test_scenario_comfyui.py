"""``grid test scenario --include-comfyui``: the lab twin of the logical fleet's media node.

The last machine becomes the ComfyUI-only media machine while the text machines stay those of
the same seed; image demand lands on it, and every runtime the run names is the name of a
real runtime plugin (so a lab finding about ``comfyui`` is about the real ComfyUI plugin).
"""

from __future__ import annotations

import pytest

from grid_core.errors import ValidationError
from grid_core.scenario.catalog import build_catalog
from grid_core.scenario.config import ScenarioConfig
from grid_core.scenario.topology import MEDIA_CLASS, build_fleet
from grid_core.testing import builtin_entry_points, plugins_with


@pytest.mark.parametrize("seed", [7, 144])
def test_media_twin_takes_the_last_machine_and_serves_the_image_demand(run, seed) -> None:
    catalog = build_catalog(6)
    plain = build_fleet(seed, 3, catalog)
    twin = build_fleet(seed, 3, catalog, media=True)
    assert twin[:-1] == plain[:-1]  # the text machines do not change
    assert twin[-1].kind == MEDIA_CLASS and MEDIA_CLASS.runtimes == ("comfyui",)

    report = run(machines=3, models=6, users=80, duration_s=30 * 60.0, seed=seed,
                 include_comfyui=True)  # fmt: skip
    assert report["scenario"]["include_comfyui"] is True
    media = report["fleet"][-1]
    assert media["runtimes"] == ["comfyui"]
    image = report["demand"]["by_workload"]["image"]
    assert image["requests"] > 0 and image["served"] > 0
    placed = {e for t in report["timeline"] for e in t["residency"]}
    image_models = [m for m in report["catalog"] if m.startswith(("image-", "illustrator-"))]
    assert any(f"ready {m}@{media['host_id']}" in placed for m in image_models), placed

    builtins = tuple(ep.name for ep in builtin_entry_points())
    adapters = set(plugins_with(builtins=builtins).runtime_adapters())
    named = {rt for row in report["fleet"] for rt in row["runtimes"]}
    assert "comfyui" in named and named <= adapters, named - adapters


def test_media_twin_needs_a_text_machine_beside_it() -> None:
    with pytest.raises(ValidationError, match="--machines 2 or more"):
        ScenarioConfig(machines=1, include_comfyui=True).validate()
