"""Operator profile input is checked strictly; persisted profiles stay loadable."""

from __future__ import annotations

import msgspec
import pytest

from grid_core.demand.features import WORKLOADS
from grid_core.errors import ValidationError
from grid_core.profile import ModelProfile, profile_from_json, validate_profile


def test_unknown_field_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="'max_replica'"):
        profile_from_json(b'{"model_id": "m", "memory_mb": 10, "max_replica": 3}')


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"runtimes": ["llama cpp"]}, "runtimes"),
        ({"runtimes": ["../echo"]}, "runtimes"),
        ({"runtimes": ["x" * 65]}, "runtimes"),
        ({"runtime_memory_mb": {"vllm\n": 5}}, "runtime_memory_mb"),
        ({"workload_scores": {"nonsense": 0.5}}, "workload_scores"),
    ],
)
def test_malformed_runtime_or_unknown_workload_is_refused(
    doc: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        profile_from_json({"model_id": "m", "memory_mb": 10, **doc})


@pytest.mark.parametrize("runtime", ["llama.cpp", "vllm", "ollama", "comfyui", "echo", "mlx-lm"])
def test_builtin_and_plugin_runtime_names_are_accepted(runtime: str) -> None:
    # A runtime plugin brings its own name; the profile must be able to ask for it.
    p = profile_from_json({"model_id": "m", "memory_mb": 10, "runtimes": [runtime]})
    assert p.runtimes == (runtime,)


def test_every_configured_workload_is_accepted() -> None:
    scores = {w: 0.5 for w in WORKLOADS}
    p = profile_from_json({"model_id": "m", "memory_mb": 10, "workload_scores": scores})
    assert p.workload_scores == scores


def test_persisted_profile_with_an_unlisted_runtime_still_validates() -> None:
    # Controller state written by another Grid version must load, not be quarantined.
    old = ModelProfile(model_id="m", memory_mb=10, runtimes=("mlx",), workload_scores={"chat": 1})
    assert validate_profile(old).runtimes == ("mlx",)


def test_every_lab_catalog_profile_is_accepted_from_an_operator() -> None:
    # The lab and the server share one vocabulary and one runtime list: a lab profile sent to
    # PUT /allocator/models must never be refused for a name the lab made up.
    from grid_core.scenario.catalog import CATALOG_SIZE, build_catalog

    used: set[str] = set()
    for entry in build_catalog(CATALOG_SIZE):
        doc = msgspec.to_builtins(entry.profile)
        assert profile_from_json(doc) == entry.profile
        used |= set(entry.profile.workload_scores)
    assert used == set(WORKLOADS)
