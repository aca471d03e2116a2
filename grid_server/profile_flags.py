"""The flags of ``grid allocator model set`` and the profile edit they make.

Every profile flag is declared here as an ``Annotated`` option named after its flag; the
command's parameter carries the flag's name in snake case. :func:`profile_edit` turns the
values of those parameters into the fields to write: a scalar flag names its profile field,
a repeatable flag fills a list field, ``NAME=VALUE`` flags fill a mapping field,
``--clear-<field>`` empties one and ``--clear FIELD`` returns any field that has a default
to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, NamedTuple

import msgspec
import typer

from grid_core.errors import EXIT_USAGE
from grid_core.profile import BUILTIN_RUNTIMES, ModelProfile
from grid_server.client import CliError

RUNTIME_HELP = (
    f"Repeatable; built in: {', '.join(BUILTIN_RUNTIMES)}, or a runtime plugin's name "
    "(default llama.cpp)."
)

MemoryMbOption = Annotated[
    int | None,
    typer.Option("--memory-mb", help="Resident MB of one replica (required for a new profile)."),
]
RuntimeMemoryMbOption = Annotated[
    list[str] | None, typer.Option("--runtime-memory-mb", help="RUNTIME=MB, repeatable.")
]
ArtifactSha256Option = Annotated[
    str | None,
    typer.Option(
        "--artifact-sha256",
        help="SHA-256 of the weights file; a host loads only these exact bytes.",
    ),
]
ArtifactSourceOption = Annotated[
    str | None,
    typer.Option(
        "--artifact-source",
        help="Where a host may download the weights: hf://owner/repo/path/file.gguf (llama.cpp), "
        "hf://owner/repo@COMMIT (vllm; the 40-hex commit) or ollama://MODEL (ollama; its id).",
    ),
]
ArtifactSizeMbOption = Annotated[
    int | None,
    typer.Option("--artifact-size-mb", help="Size of the weights file (MB), for disk admission."),
]
RuntimeOption = Annotated[list[str] | None, typer.Option("--runtime", help=RUNTIME_HELP)]
BackendOption = Annotated[
    list[str] | None,
    typer.Option(
        "--backend", help="Repeatable; the host must offer one (cuda, metal, …). Default: any."
    ),
]
MinReplicasOption = Annotated[int | None, typer.Option("--min-replicas", help="Default 0.")]
MaxReplicasOption = Annotated[int | None, typer.Option("--max-replicas", help="Default 1.")]
PriorityOption = Annotated[int | None, typer.Option("--priority", help="Default 0.")]
DataTierOption = Annotated[
    str | None, typer.Option("--data-tier", help="The host must list this data tier.")
]
RequiredTagOption = Annotated[
    list[str] | None,
    typer.Option("--required-tag", help="Repeatable; the host must carry every one."),
]
ForbiddenTagOption = Annotated[
    list[str] | None, typer.Option("--forbidden-tag", help="Repeatable; the host must carry none.")
]
MinFailureDomainsOption = Annotated[
    int | None,
    typer.Option(
        "--min-failure-domains", help="Spread replicas over at least this many domains. Default 1."
    ),
]
MaxColocatedModelsOption = Annotated[
    int | None,
    typer.Option(
        "--max-colocated-models",
        help="Models per host including this one; 0 unlimited (default), 1 exclusive.",
    ),
]
ColocationExcludeOption = Annotated[
    list[str] | None,
    typer.Option("--colocation-exclude", help="Repeatable; a model never placed on the same host."),
]
PinOption = Annotated[
    list[str] | None,
    typer.Option(
        "--pin", help="Repeatable; a host that must hold a replica (a floor, not a ceiling)."
    ),
]
MinGpuCountOption = Annotated[
    int | None, typer.Option("--min-gpu-count", help="GPUs the host must have. Default 0.")
]
MinGpuMemoryMbOption = Annotated[
    int | None,
    typer.Option(
        "--min-gpu-memory-mb", help="GPU memory the host must have per GPU (MB). Default 0."
    ),
]
ReplicaConcurrencyOption = Annotated[
    int | None,
    typer.Option("--replica-concurrency", help="Requests one replica serves at once. Default 1."),
]
TargetUtilizationOption = Annotated[
    float | None,
    typer.Option(
        "--target-utilization",
        help="Share of a replica's concurrency to plan for, 0-1. Default 0.7.",
    ),
]
ExpectedServiceTimeSOption = Annotated[
    float | None,
    typer.Option(
        "--expected-service-time-s", help="Seconds per request before any is measured. Default 2."
    ),
]
LatencySloMsOption = Annotated[
    float | None,
    typer.Option("--latency-slo-ms", help="p95 latency objective (ms); misses add demand."),
]
LoadEstimateSOption = Annotated[
    float | None,
    typer.Option(
        "--load-estimate-s",
        help="Seconds to fetch and verify the weights, before measured. Default 30.",
    ),
]
WarmEstimateSOption = Annotated[
    float | None,
    typer.Option(
        "--warm-estimate-s",
        help="Seconds to start the engine until ready, before measured. Default 10.",
    ),
]
AdmissionHeadroomMbOption = Annotated[
    int | None,
    typer.Option(
        "--admission-headroom-mb",
        help="Free MB a new replica must leave on its host (default: a tenth of its memory, "
        "at least 512).",
    ),
]
MinResidencySOption = Annotated[
    float | None,
    typer.Option(
        "--min-residency-s",
        help="Seconds a new replica stays before it may be removed. Default 300.",
    ),
]
ScaleDownCooldownSOption = Annotated[
    float | None,
    typer.Option(
        "--scale-down-cooldown-s", help="Seconds without demand before scaling down. Default 600."
    ),
]
WorkloadScoreOption = Annotated[
    list[str] | None, typer.Option("--workload-score", help="WORKLOAD=SCORE in (0, 1], repeatable.")
]
ReplaceOption = Annotated[
    bool,
    typer.Option(
        "--replace", help="Replace the whole profile: fields not given return to their defaults."
    ),
]
ClearPinsOption = Annotated[bool, typer.Option("--clear-pins", help="Remove every pin.")]
ClearRequiredTagsOption = Annotated[
    bool, typer.Option("--clear-required-tags", help="Remove every required tag.")
]
ClearForbiddenTagsOption = Annotated[
    bool, typer.Option("--clear-forbidden-tags", help="Remove every forbidden tag.")
]
ClearBackendsOption = Annotated[bool, typer.Option("--clear-backends", help="Any backend again.")]
ClearColocationExcludesOption = Annotated[
    bool, typer.Option("--clear-colocation-excludes", help="Remove every colocation exclude.")
]
ClearRuntimeMemoryMbOption = Annotated[
    bool, typer.Option("--clear-runtime-memory-mb", help="Use --memory-mb on every runtime.")
]
ClearWorkloadScoresOption = Annotated[
    bool,
    typer.Option("--clear-workload-scores", help="Remove every workload score (no auto traffic)."),
]
ClearRuntimesOption = Annotated[
    bool, typer.Option("--clear-runtimes", help="Back to the default runtime (llama.cpp).")
]
ClearOption = Annotated[
    list[str] | None,
    typer.Option(
        "--clear",
        metavar="FIELD",
        help="Return FIELD to its default; every other field is kept (repeatable). FIELD as "
        "'model show' prints it (latency_slo_ms), or the flag that sets it (--latency-slo-ms).",
    ),
]
CLEAR_PARAM = "clear"
"""The ``model set`` parameter of the repeatable ``--clear FIELD`` flag."""

SCALAR_FIELDS = (
    "memory_mb",
    "artifact_sha256",
    "artifact_source",
    "artifact_size_mb",
    "min_replicas",
    "max_replicas",
    "priority",
    "data_tier",
    "min_failure_domains",
    "max_colocated_models",
    "min_gpu_count",
    "min_gpu_memory_mb",
    "replica_concurrency",
    "target_utilization",
    "expected_service_time_s",
    "latency_slo_ms",
    "load_estimate_s",
    "warm_estimate_s",
    "admission_headroom_mb",
    "min_residency_s",
    "scale_down_cooldown_s",
)
"""Profile fields set by a flag of the same name (``--memory-mb`` sets ``memory_mb``)."""
LIST_FIELDS = {
    "runtime": "runtimes",
    "backend": "backends",
    "required_tag": "required_tags",
    "forbidden_tag": "forbidden_tags",
    "colocation_exclude": "colocation_excludes",
    "pin": "pins",
}
"""Repeatable flag's parameter → the list field its values make up (``--pin`` → ``pins``)."""


class PairFlag(NamedTuple):
    """A repeatable ``NAME=VALUE`` flag and the mapping field its values make up."""

    field: str
    """The profile field (``workload_scores``)."""
    flag: str
    """The flag as typed (``--workload-score``)."""
    cast: type
    """The type of VALUE: ``int`` (a whole number) or ``float``."""
    name: str
    """What NAME stands for in messages (``WORKLOAD``)."""
    value: str
    """What VALUE stands for in messages (``SCORE``)."""


PAIR_FIELDS: dict[str, PairFlag] = {
    "runtime_memory_mb": PairFlag("runtime_memory_mb", "--runtime-memory-mb", int, "RUNTIME", "MB"),
    "workload_score": PairFlag("workload_scores", "--workload-score", float, "WORKLOAD", "SCORE"),
}
"""``NAME=VALUE`` flag's parameter → the flag and the mapping field it fills."""
CLEARABLE_FIELDS = (
    "pins",
    "required_tags",
    "forbidden_tags",
    "backends",
    "colocation_excludes",
    "runtime_memory_mb",
    "workload_scores",
    "runtimes",
)
"""Fields ``--clear-<field>`` (parameter ``clear_<field>``) empties, in the order checked."""


def profile_edit(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The profile fields ``model set``'s flags change: field name → new value.

    Args:
        flags: the command's parameters by name (a flag not given is ``None``, ``False`` or
            an empty list; names beyond the profile flags are ignored).

    Returns:
        Only the fields given: scalars as given, lists as tuples, ``NAME=VALUE`` flags as
        mappings, and each cleared field (``--clear-<field>``, ``--clear FIELD``) at its
        default value.

    Raises:
        CliError: a ``NAME=VALUE`` flag without ``=``, with a VALUE of the wrong type or
            naming one NAME twice; a ``--clear`` naming no field or a field without a
            default (see :func:`clear_field`); or a field both cleared and given (exit 2).
            Raised before anything is read or written.
    """
    given: dict[str, Any] = {name: flags.get(name) for name in SCALAR_FIELDS}
    for param, field in LIST_FIELDS.items():
        given[field] = tuple(flags.get(param) or ())
    for param, pair in PAIR_FIELDS.items():
        given[pair.field] = _pairs(flags.get(param) or [], pair)
    # A scalar flag not given is None, a repeatable one is empty: neither changes the field.
    given = {k: v for k, v in given.items() if v is not None and v != () and v != {}}
    clears = {
        name: f"--clear-{name.replace('_', '-')}"
        for name in CLEARABLE_FIELDS
        if flags.get(f"clear_{name}")
    }
    for raw in flags.get(CLEAR_PARAM) or ():
        clears.setdefault(clear_field(raw), f"--clear {raw}")
    given.update(_cleared(clears, given))
    return given


def clear_field(raw: str) -> str:
    """The profile field ``--clear RAW`` returns to its default.

    RAW is canonically the field as ``grid allocator model show`` prints it
    (``latency_slo_ms``); the flag that sets the field is accepted too (``--latency-slo-ms``,
    ``--pin`` for ``pins``), with or without its dashes and with ``-`` or ``_`` alike.

    Raises:
        CliError: RAW names no profile field, or a field with no default to return to
            (``model_id``, ``memory_mb``); exit 2, the message names the field and the fix.
    """
    name = raw.strip().lstrip("-").replace("-", "_")
    pair = PAIR_FIELDS.get(name)
    field = LIST_FIELDS.get(name) or (pair.field if pair else name)
    defaults = _defaults()
    if field in defaults:
        return field
    if field == "model_id":
        msg = (
            f"--clear {raw}: model_id names the profile and has no default; to retire the "
            "profile use 'grid allocator model remove MODEL'"
        )
    elif field in ModelProfile.__struct_fields__:
        msg = (
            f"--clear {raw}: {field} is required and has no default to return to; to change "
            f"it, give {_flag_of(field)} without --clear"
        )
    else:
        msg = (
            f"--clear {raw!r}: no profile field of that name; give a field as 'grid allocator "
            f"model show' prints it ({', '.join(defaults)}) or its flag (e.g. --latency-slo-ms)"
        )
    raise CliError(msg, EXIT_USAGE)


def _defaults() -> dict[str, Any]:
    """Every profile field that has a default, at that default (a fresh one per call)."""
    return {
        f.name: f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
        for f in msgspec.structs.fields(ModelProfile)
        if f.default is not msgspec.NODEFAULT or f.default_factory is not msgspec.NODEFAULT
    }


def _pairs(values: list[str], pair: PairFlag) -> dict[str, Any]:
    """``NAME=VALUE`` strings as a mapping of NAME to VALUE cast to ``pair.cast``.

    Raises:
        CliError: a value without ``=`` or NAME, a VALUE that is not a number of that type,
            or a NAME given twice (exit 2; the message names the flag and its form).
    """
    form = f"{pair.name}={pair.value}"
    out: dict[str, Any] = {}
    for v in values:
        key, sep, raw = v.partition("=")
        if not sep or not key:
            raise CliError(f"{pair.flag} {v!r}: use {form}", EXIT_USAGE)
        try:
            value = pair.cast(raw)
        except ValueError:
            kind = "whole number" if pair.cast is int else "number"
            msg = f"{pair.flag} {v!r}: {pair.value} {raw!r} is not a {kind}; use {form}"
            raise CliError(msg, EXIT_USAGE) from None
        if key in out:
            msg = f"{pair.flag} names {key!r} twice; give each {pair.name} once"
            raise CliError(msg, EXIT_USAGE)
        out[key] = value
    return out


def _cleared(clears: dict[str, str], given: dict[str, Any]) -> dict[str, Any]:
    """The default values of the cleared fields.

    Args:
        clears: cleared field → the flag that cleared it, as typed (``--clear-pins``,
            ``--clear latency_slo_ms``); every field has a default (:func:`clear_field`).
        given: the fields set by the other flags.

    Raises:
        CliError: a field is both cleared and given (exit 2; names both flags).
    """
    defaults = _defaults()
    out: dict[str, Any] = {}
    for name, clear in clears.items():
        if name in given:
            msg = f"{clear} and {_flag_of(name)} were both given; use one of them"
            raise CliError(msg, EXIT_USAGE)
        out[name] = defaults[name]
    return out


def _flag_of(field: str) -> str:
    """The flag that sets a field (``latency_slo_ms`` → ``--latency-slo-ms``, ``pins`` →
    ``--pin``)."""
    if field in SCALAR_FIELDS:
        return "--" + field.replace("_", "-")
    for param, listed in LIST_FIELDS.items():
        if listed == field:
            return "--" + param.replace("_", "-")
    return next(pair.flag for pair in PAIR_FIELDS.values() if pair.field == field)
