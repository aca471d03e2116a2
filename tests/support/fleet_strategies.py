"""Hypothesis strategies for Grid fleets: hosts, models (profiles), residencies and demand.

Every value is drawn from Hypothesis, never from a seeded random generator, so a failing
example shrinks toward a minimal fleet: fewer hosts, fewer models, fewer residencies, smaller
sizes, and the first (plainest) choice of every option. Options are therefore listed plainest
first (an accepting, healthy, fresh host; a ready, managed residency), and rare conditions
are drawn with :func:`rarely` so they stay as rare as a real fleet makes them.

``describe_plan_inputs`` renders a fleet compactly (only fields that differ from their
defaults), for ``hypothesis.note`` in property tests: a failure then prints the minimal fleet
in a few readable lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import TypeVar

import msgspec
from hypothesis import strategies as st

from grid_core.demand.types import ModelDemand
from grid_core.planner import PlanInputs, PlannerPolicy
from grid_core.profile import ModelProfile, validate_profile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot

T = TypeVar("T")

GB = 1024
NOW = 1_800_000_000.0
MODEL_IDS = ("m0", "m1", "m2", "m3", "m4", "m5")
HOST_IDS = tuple(f"h{i}" for i in range(7))
TAGS = ("ecc", "office", "fast-disk")
HOST_STATES = (
    "accepting",
    "accepting",
    "accepting",
    "throttled",
    "draining",
    "paused",
    "unhealthy",
    "quarantined",
)
HEARTBEAT_AGES = (1.0, 1.0, 5.0, 400.0, None, -60.0, -1.0)
"""Fresh first; then stale, unknown and future-dated reports (each must make a host ineligible
or be tolerated exactly as the planner's eligibility rule says)."""
RESIDENCY_STATES = ("ready", "ready", "loading", "warming", "draining", "failed", "cached")
OWNERSHIPS = ("managed", "managed", "managed", "external", "manual", "pinned")
RUNTIME_SETS = (("llama.cpp",), ("vllm",), ("llama.cpp", "vllm"))


def rarely(plain: T, unusual: Sequence[T], one_in: int) -> st.SearchStrategy[T]:
    """``plain`` most of the time, one of ``unusual`` about once in ``one_in`` draws.

    One choice per draw (cheap to generate), and it shrinks to ``plain``: Hypothesis shrinks
    ``sampled_from`` toward its first element.
    """
    return st.sampled_from([plain] * ((one_in - 1) * len(unusual)) + list(unusual))


@cache
def _rarely_one(values: tuple[str, ...], one_in: int) -> st.SearchStrategy[tuple[str, ...]]:
    return rarely((), [(v,) for v in values], one_in)


def _gb(low: int, high: int) -> st.SearchStrategy[int]:
    """Whole gigabytes from ``low`` to ``high``, in MB (shrinks to ``low``)."""
    return st.sampled_from([g * GB for g in range(low, high + 1)])


# Strategies are built once, and each field is one choice: generating a fleet must stay cheap
# next to planning it, 500 times per property.
_GB_1_16 = _gb(1, 16)
_GB_1_24 = _gb(1, 24)
_GB_4_64 = _gb(4, 64)
_GB_0_4 = _gb(0, 4)
_RESIDENCY_STATE = st.sampled_from(RESIDENCY_STATES)
_OWNERSHIP = st.sampled_from(OWNERSHIPS)
_ACTIVE = st.sampled_from([0, 0, 2, None])
_LOADED_AGO = st.sampled_from([5000.0, 10.0])
_REPLICAS = st.integers(1, 4)
_MIN_REPLICAS = {most: st.integers(0, most) for most in range(1, 5)}
_RUNTIME_SET = st.sampled_from(RUNTIME_SETS)
_VLLM_MEMORY = rarely({}, [{"vllm": g * GB} for g in range(1, 25)], 2)
_BACKENDS = st.sampled_from([(), (), ("cuda",), ("metal",)])
_PRIORITY = st.integers(0, 2)
_DOMAINS = st.integers(1, 3)
_COLOCATED = st.sampled_from([0, 0, 0, 1, 2])
_ARTIFACT = st.sampled_from([None, 2 * GB, 8 * GB])
_MIN_RESIDENCY = st.sampled_from([0.0, 300.0])
_RESIDENT_IDS = st.lists(st.sampled_from([*MODEL_IDS, "ext-1"]), max_size=3, unique=True)
_DERATING = st.sampled_from([0.0, 0.0, 0.1])
_HOST_STATE = st.sampled_from(HOST_STATES)
_HEALTHY = rarely(True, [False], 7)
_AGE = st.sampled_from(HEARTBEAT_AGES)
_HOST_RUNTIMES = st.sampled_from([("llama.cpp",), ("llama.cpp", "vllm"), ("vllm",)])
_HOST_BACKENDS = st.sampled_from([("metal",), ("cuda",)])
_TAG_SET = st.sampled_from(
    sorted(
        (tuple(sorted(t for i, t in enumerate(TAGS) if mask >> i & 1)) for mask in range(8)),
        key=len,
    )
)
_DOMAIN = st.sampled_from(["fd-1", "fd-2", "fd-3", None])
_MAX_MODELS = st.sampled_from([0, 0, 1, 2, 3])
_THROTTLE = st.sampled_from([1.0, 1.0, 0.5])
_EXTERNAL = st.sampled_from([0, 0, 2 * GB])
_DISK = st.sampled_from([None, 4 * GB, 40 * GB])
_BOOL = st.booleans()
_DESIRED = st.integers(0, 6)
_QUEUE = st.sampled_from([0.0, 3.0])
_RATE = st.sampled_from([0.0, 1.0, 2.0])
_HEADROOM = st.sampled_from([0, 512])
_HEADROOM_FRACTION = st.sampled_from([0.0, 0.1, 0.25])


@cache
def _cached_ids(model_ids: tuple[str, ...]) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(model_ids), unique=True)


@st.composite
def residencies(draw: st.DrawFn, model_id: str) -> ResidencySnapshot:
    """One residency of ``model_id`` in any lifecycle state and ownership."""
    return ResidencySnapshot(
        model_id=model_id,
        memory_mb=draw(_GB_1_16),
        state=draw(_RESIDENCY_STATE),
        ownership=draw(_OWNERSHIP),
        active_requests=draw(_ACTIVE),
        loaded_at=NOW - draw(_LOADED_AGO),
    )


@st.composite
def model_profiles(draw: st.DrawFn, model_id: str, peers: Sequence[str]) -> ModelProfile:
    """One valid profile: memory 1–24 GB, 1–4 replicas, optional runtime, backend, tag,
    colocation, pin, artifact and minimum-residency constraints.

    Args:
        model_id: its id.
        peers: the other configured model ids (colocation exclusions name one of them).
    """
    most = draw(_REPLICAS)
    runtimes = draw(_RUNTIME_SET)
    runtime_memory: dict[str, int] = draw(_VLLM_MEMORY) if "vllm" in runtimes else {}
    others = tuple(m for m in peers if m != model_id)
    return validate_profile(
        ModelProfile(
            model_id=model_id,
            memory_mb=draw(_GB_1_24),
            runtime_memory_mb=runtime_memory,
            runtimes=runtimes,
            backends=draw(_BACKENDS),
            min_replicas=draw(_MIN_REPLICAS[most]),
            max_replicas=most,
            priority=draw(_PRIORITY),
            required_tags=draw(_rarely_one(TAGS, 5)),
            forbidden_tags=draw(_rarely_one(TAGS, 5)),
            min_failure_domains=draw(_DOMAINS),
            max_colocated_models=draw(_COLOCATED),
            colocation_excludes=draw(_rarely_one(others, 3)) if others else (),
            pins=draw(_rarely_one(HOST_IDS, 10)),
            artifact_size_mb=draw(_ARTIFACT),
            min_residency_s=draw(_MIN_RESIDENCY),
        )
    )


@st.composite
def host_snapshots(draw: st.DrawFn, host_id: str, model_ids: Sequence[str]) -> HostSnapshot:
    """One host report: capacity 4–64 GB, any lifecycle state and heartbeat age, up to three
    residencies (configured models, unconfigured ones and an external ``ext-1``) and cached
    artifacts of some configured models.

    Args:
        host_id: its id.
        model_ids: the configured model ids (cached artifacts are drawn among them).
    """
    resident = draw(_RESIDENT_IDS)
    cached = draw(_cached_ids(tuple(model_ids))) if model_ids else []
    return HostSnapshot(
        host_id=host_id,
        capacity_mb=draw(_GB_4_64),
        reserved_mb=draw(_GB_0_4),
        thermal_derating=draw(_DERATING),
        state=draw(_HOST_STATE),
        healthy=draw(_HEALTHY),
        heartbeat_age_s=draw(_AGE),
        runtimes=draw(_HOST_RUNTIMES),
        backends=draw(_HOST_BACKENDS),
        tags=draw(_TAG_SET),
        failure_domain=draw(_DOMAIN),
        max_models=draw(_MAX_MODELS),
        throttle_fraction=draw(_THROTTLE),
        external_used_mb=draw(_EXTERNAL),
        artifact_disk_free_mb=draw(_DISK),
        residencies=tuple(draw(residencies(m)) for m in resident),
        cached={m: None for m in sorted(cached)},
    )


@st.composite
def model_demands(draw: st.DrawFn, model_ids: Sequence[str]) -> dict[str, ModelDemand]:
    """Forecast demand for some of ``model_ids`` (shrinks to none)."""
    out = {}
    for mid in model_ids:
        if draw(_BOOL):
            out[mid] = ModelDemand(
                model_id=mid,
                desired_replicas=draw(_DESIRED),
                queue_depth=draw(_QUEUE),
                request_rate_rps=draw(_RATE),
                direct=draw(_BOOL),
            )
    return out


@st.composite
def plan_inputs(
    draw: st.DrawFn, max_models: int = len(MODEL_IDS), max_hosts: int = len(HOST_IDS)
) -> PlanInputs:
    """A heterogeneous fleet to plan: 1–6 models, 1–7 hosts, demand, admission headroom."""
    ids = MODEL_IDS[: draw(st.integers(1, max_models))]
    profiles = tuple(draw(model_profiles(mid, ids)) for mid in ids)
    hosts = tuple(
        draw(host_snapshots(hid, ids)) for hid in HOST_IDS[: draw(st.integers(1, max_hosts))]
    )
    return PlanInputs(
        now=NOW,
        profiles=profiles,
        hosts=hosts,
        demand=draw(model_demands(ids)),
        policy=PlannerPolicy(
            admission_headroom_mb=draw(_HEADROOM),
            admission_headroom_fraction=draw(_HEADROOM_FRACTION),
        ),
    )


def _changed(value: msgspec.Struct, skip: tuple[str, ...] = ()) -> str:
    """``field=value`` for each field that differs from its default (``skip`` left out)."""
    fields = value.__struct_fields__
    defaults = value.__struct_defaults__
    first_default = len(fields) - len(defaults)
    parts = []
    for i, name in enumerate(fields):
        current = getattr(value, name)
        if name in skip:
            continue
        if i >= first_default:
            default = defaults[i - first_default]
            factory = getattr(default, "factory", None)
            if (factory() if callable(factory) else default) == current:
                continue
        parts.append(f"{name}={current!r}")
    return ", ".join(parts)


def describe_plan_inputs(inputs: PlanInputs) -> str:
    """A compact, readable rendering of a fleet (non-default fields only), one line each."""
    lines = [f"policy: {_changed(inputs.policy) or 'defaults'}"]
    lines += [f"model {_changed(p)}" for p in inputs.profiles]
    for h in inputs.hosts:
        lines.append(f"host {_changed(h, skip=('residencies',))}")
        lines += [f"    residency {_changed(r)}" for r in h.residencies]
    lines += [f"demand {_changed(d)}" for d in inputs.demand.values()]
    return "\n".join(lines)


@dataclass(frozen=True)
class ModelSpec:
    """A model of a simulated fleet: memory (MB) and replica bounds."""

    memory_mb: int
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True)
class SimFleetSpec:
    """A simulated fleet to start a stateful test from.

    Attributes:
        hosts: host id → capacity (MB); ids are ``h1`` … ``hN``.
        models: model id → its spec; ids are ``a``, ``b``, ``c`` in order.
    """

    hosts: dict[str, int]
    models: dict[str, ModelSpec]


SIM_HOST_CAPACITIES_MB = (10_000, 8_000, 12_000)
"""Tight on purpose: most pairs of simulated models do not fit one host, so any memory
mistake shows."""
SIM_MODEL_MEMORY_MB = (5000, 4000, 6000)


@st.composite
def sim_fleets(draw: st.DrawFn, max_hosts: int = 4, max_models: int = 3) -> SimFleetSpec:
    """1–``max_hosts`` hosts and 1–``max_models`` models (at most one replica required)."""
    hosts = {
        f"h{i}": draw(st.sampled_from(SIM_HOST_CAPACITIES_MB))
        for i in range(1, draw(st.integers(1, max_hosts)) + 1)
    }
    models = {}
    for mid in "abc"[: draw(st.integers(1, max_models))]:
        low = draw(st.integers(0, 1))
        models[mid] = ModelSpec(
            memory_mb=draw(st.sampled_from(SIM_MODEL_MEMORY_MB)),
            min_replicas=low,
            max_replicas=max(1, low + draw(st.integers(0, 1))),
        )
    return SimFleetSpec(hosts=hosts, models=models)
