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
        | {profile_flags.CLEAR_PARAM}
    )
    assert set(_not_given()) == mapped
    fields = set(ModelProfile.__struct_fields__)
    assert set(profile_flags.SCALAR_FIELDS) <= fields
    assert set(profile_flags.LIST_FIELDS.values()) <= fields
    assert {pair.field for pair in profile_flags.PAIR_FIELDS.values()} <= fields
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
    with pytest.raises(CliError, match="--runtime-memory-mb 'vllm': use RUNTIME=MB"):
        profile_flags.profile_edit(flags)
    flags["runtime_memory_mb"] = ["vllm=100"]
    with pytest.raises(CliError, match="--clear-pins and --pin were both given"):
        profile_flags.profile_edit(flags)


@pytest.mark.parametrize(
    ("flag", "values", "message"),
    [
        (
            "workload_score",
            ["coding=abc"],
            "--workload-score 'coding=abc': SCORE 'abc' is not a number",
        ),
        ("workload_score", ["coding"], "--workload-score 'coding': use WORKLOAD=SCORE"),
        ("workload_score", ["=0.5"], "--workload-score '=0.5': use WORKLOAD=SCORE"),
        (
            "runtime_memory_mb",
            ["vllm=1.5"],
            "--runtime-memory-mb 'vllm=1.5': MB '1.5' is not a whole number",
        ),
        (
            "workload_score",
            ["coding=0.3", "coding=0.9"],
            "--workload-score names 'coding' twice; give each WORKLOAD once",
        ),
    ],
)
def test_a_bad_name_value_flag_names_the_flag_and_what_is_wrong(flag, values, message) -> None:
    """A well-formed pair with a bad VALUE is not told to "use NAME=VALUE", and a name given
    twice is refused instead of the last value silently winning."""
    with pytest.raises(CliError, match=message) as exc:
        profile_flags.profile_edit(_not_given() | {flag: values})
    assert exc.value.exit_code == 2


@pytest.mark.parametrize(
    ("given", "clear", "message"),
    [
        ({"pin": ["h"]}, "clear_pins", "--clear-pins and --pin were both given"),
        ({"runtime": ["vllm"]}, "clear_runtimes", "--clear-runtimes and --runtime were both given"),
        (
            {"workload_score": ["coding=1"]},
            "clear_workload_scores",
            "--clear-workload-scores and --workload-score were both given",
        ),
    ],
)
def test_a_clear_and_a_value_together_name_both_flags(given, clear, message) -> None:
    with pytest.raises(CliError, match=message):
        profile_flags.profile_edit(_not_given() | given | {clear: True})


@pytest.mark.parametrize(
    ("raw", "field", "default"),
    [
        ("latency_slo_ms", "latency_slo_ms", None),  # the canonical form: the field's name
        ("--latency-slo-ms", "latency_slo_ms", None),  # the flag that sets it
        ("latency-slo-ms", "latency_slo_ms", None),
        ("data_tier", "data_tier", None),
        ("--artifact-source", "artifact_source", None),
        ("admission_headroom_mb", "admission_headroom_mb", None),
        ("priority", "priority", 0),
        ("--pin", "pins", ()),
        ("--workload-score", "workload_scores", {}),
        ("runtimes", "runtimes", ("llama.cpp",)),
    ],
)
def test_clear_returns_one_field_to_its_default_in_either_spelling(raw, field, default) -> None:
    edit = profile_flags.profile_edit(_not_given() | {"clear": [raw], "max_replicas": 3})
    assert edit == {field: default, "max_replicas": 3}


def test_clear_repeats_and_agrees_with_the_list_clear_flags() -> None:
    flags = _not_given() | {"clear": ["latency_slo_ms", "--data-tier", "pins"], "clear_pins": True}
    assert profile_flags.profile_edit(flags) == {
        "latency_slo_ms": None,
        "data_tier": None,
        "pins": (),
    }


@pytest.mark.parametrize(
    ("raw", "given", "message"),
    [
        ("latency", {}, r"--clear 'latency': no profile field of that name; .*latency_slo_ms"),
        ("", {}, "--clear '': no profile field of that name"),
        (
            "memory_mb",
            {},
            "--clear memory_mb: memory_mb is required and has no default to return to; "
            "to change it, give --memory-mb without --clear",
        ),
        ("--model-id", {}, "model_id names the profile and has no default; .* model remove"),
        (
            "latency_slo_ms",
            {"latency_slo_ms": 250.0},
            "--clear latency_slo_ms and --latency-slo-ms were both given; use one of them",
        ),
        (
            "--pin",
            {"pin": ["h"]},
            "--clear --pin and --pin were both given; use one of them",
        ),
    ],
)
def test_a_clear_that_cannot_be_done_is_refused_naming_the_field_and_the_fix(
    raw, given, message
) -> None:
    with pytest.raises(CliError, match=message) as exc:
        profile_flags.profile_edit(_not_given() | given | {"clear": [raw]})
    assert exc.value.exit_code == 2
