"""``grid allocator model set``'s flags → the profile fields they change."""

from __future__ import annotations

import inspect

import msgspec
import pytest

from grid_core.profile import ModelProfile
from grid_server import cli_allocator, profile_flags
from grid_server.client import CliError

NOT_PROFILE_FLAGS = {"model_id", "replace", "grid", "token_file"}
"""``model set`` parameters that name no profile field."""


def _not_given() -> dict[str, object]:
    """Every ``model set`` parameter at the value it has when its flag is not given."""
    params = inspect.signature(cli_allocator.model_set).parameters
    return {name: p.default for name, p in params.items() if name not in NOT_PROFILE_FLAGS}


def test_every_model_set_flag_maps_to_a_profile_field() -> None:
    """A flag added to the command but not to the tables would be parsed and then dropped."""
    mapped = (
        set(profile_flags.SCALAR_FIELDS)
        | set(profile_flags.LIST_FIELDS)
        | set(profile_flags.PAIR_FIELDS)
        | {f"clear_{name}" for name in profile_flags.CLEARABLE_FIELDS}
    )
    assert set(_not_given()) == mapped
    fields = set(ModelProfile.__struct_fields__)
    assert set(profile_flags.SCALAR_FIELDS) <= fields
    assert set(profile_flags.LIST_FIELDS.values()) <= fields
    assert {field for field, _, _ in profile_flags.PAIR_FIELDS.values()} <= fields
    assert set(profile_flags.CLEARABLE_FIELDS) <= fields


def test_no_flag_given_changes_nothing() -> None:
    assert profile_flags.profile_edit(_not_given()) == {}


def test_each_kind_of_flag_becomes_its_field() -> None:
    flags = _not_given() | {
        "memory_mb": 0,
        "pin": ["h1", "h2"],
        "workload_score": ["coding=0.5"],
        "clear_backends": True,
    }
    edit = profile_flags.profile_edit(flags)
    default = msgspec.structs.fields(ModelProfile)
    empty_backends = next(f for f in default if f.name == "backends")
    assert edit == {
        "memory_mb": 0,  # a zero is given, not absent
        "pins": ("h1", "h2"),
        "workload_scores": {"coding": 0.5},
        "backends": empty_backends.default,
    }


def test_a_bad_pair_is_refused_before_a_conflicting_clear() -> None:
    flags = _not_given() | {"runtime_memory_mb": ["vllm"], "pin": ["h"], "clear_pins": True}
    with pytest.raises(CliError, match="--runtime-memory-mb 'vllm': use NAME=VALUE"):
        profile_flags.profile_edit(flags)
    flags["runtime_memory_mb"] = ["vllm=100"]
    with pytest.raises(CliError, match="--clear-pins and a value for pins"):
        profile_flags.profile_edit(flags)
