"""Heterogeneous logical machines: Apple/Metal, ComfyUI/MPS, NVIDIA/vLLM/ComfyUI, media.

Every logical machine holds one model at a time (``max_models=1``), like the logical nodes of
the specification's scenario lab; memory, reserve, disk, cached artifacts, concurrency and
speed differ by machine class. Topology draws only from the ``topology`` stream, so the
users' requests do not change when the fleet does.
"""

from __future__ import annotations

from dataclasses import dataclass

from grid_core.scenario.catalog import CatalogEntry
from grid_core.scenario.streams import stream

FAILURE_DOMAIN_SIZE = 4
"""Machines per failure domain (one rack / one power strip)."""
MAX_INITIAL_CACHED = 2
"""Artifacts a machine already holds at the start: a warm cache, not a full one."""


@dataclass(frozen=True)
class MachineClass:
    """A kind of machine (memory and disk in MB; speed relative to the reference machine)."""

    name: str
    capacity_mb: int
    reserved_mb: int
    runtimes: tuple[str, ...]
    backends: tuple[str, ...]
    gpu_memory_mb: int
    concurrency: int
    speed: float
    disk_mb: int
    weight: float
    tags: tuple[str, ...] = ()


CLASSES: tuple[MachineClass, ...] = (
    MachineClass(
        "mac-studio-64",
        65536,
        12288,
        ("llama.cpp", "comfyui"),
        ("metal", "mps"),
        0,
        4,
        0.9,
        1_000_000,
        3.0,
    ),
    MachineClass(
        "rtx-4090",
        24576,
        1024,
        ("vllm", "comfyui", "llama.cpp"),
        ("cuda",),
        24576,
        8,
        1.8,
        2_000_000,
        3.0,
    ),
    MachineClass("mac-mini-24", 24576, 6144, ("llama.cpp",), ("metal",), 0, 2, 0.5, 250_000, 3.0),
    MachineClass(
        "media-48", 49152, 2048, ("comfyui",), ("cuda",), 49152, 2, 1.5, 4_000_000, 1.0, ("media",)
    ),
    MachineClass(
        "mac-studio-192",
        196608,
        16384,
        ("llama.cpp", "comfyui"),
        ("metal", "mps"),
        0,
        6,
        1.1,
        2_000_000,
        1.5,
    ),
    MachineClass(
        "a100-80", 81920, 2048, ("vllm", "comfyui"), ("cuda",), 81920, 16, 2.6, 4_000_000, 1.0
    ),
)
"""The first four are placed in order so even a 1–4 machine fleet is heterogeneous."""
MEDIA_CLASS = next(c for c in CLASSES if c.runtimes == ("comfyui",))
"""The ComfyUI-only media machine: with ``media`` it is the fleet's last machine, like the
logical fleet's ``--include-comfyui`` media node (the text machines stay the same)."""


@dataclass(frozen=True)
class Machine:
    """One logical machine of the fleet.

    Attributes:
        host_id: stable id (``m00-rtx-4090``).
        kind: its :class:`MachineClass`.
        failure_domain: ``fd-<n>``.
        cached: model ids whose artifacts are already on disk at the start.
    """

    host_id: str
    kind: MachineClass
    failure_domain: str
    cached: tuple[str, ...]


def compatible(entry: CatalogEntry, kind: MachineClass) -> bool:
    """Whether ``entry`` can ever run on ``kind`` (runtime, backend, GPU, memory)."""
    p = entry.profile
    runtimes = [r for r in p.runtimes if r in kind.runtimes]
    if not runtimes:
        return False
    if p.backends and not set(p.backends) & set(kind.backends):
        return False
    if p.min_gpu_count and (kind.gpu_memory_mb <= 0 or kind.gpu_memory_mb < p.min_gpu_memory_mb):
        return False
    return p.memory_for(runtimes) <= kind.capacity_mb - kind.reserved_mb


def build_fleet(
    seed: int, machines: int, catalog: tuple[CatalogEntry, ...], *, media: bool = False
) -> tuple[Machine, ...]:
    """The fleet of ``machines`` logical machines for ``seed``.

    Classes come from the topology stream only; cached artifacts come from a per-machine
    sub-stream and are limited to compatible catalog entries that fit the machine's disk.
    With ``media`` the last machine is :data:`MEDIA_CLASS`; the others are exactly those of
    the same seed without it (the stream is drawn the same way).
    """
    rng = stream(seed, "topology")
    weights = [c.weight for c in CLASSES]
    out: list[Machine] = []
    for i in range(machines):
        kind = CLASSES[i] if i < 4 else rng.choices(CLASSES, weights)[0]
        if media and i == machines - 1:
            kind = MEDIA_CLASS
        cache_rng = stream(seed, "topology", "cache", i)
        fits = [e.model_id for e in catalog if compatible(e, kind)]
        n = min(len(fits), cache_rng.randint(0, MAX_INITIAL_CACHED))
        cached = tuple(sorted(cache_rng.sample(fits, n)))
        out.append(Machine(f"m{i:02d}-{kind.name}", kind, f"fd-{i // FAILURE_DOMAIN_SIZE}", cached))
    return tuple(out)
