"""The scenario's model catalog: text, code, research, writing, image, video and embedding.

Sixteen base entries are listed in an order that covers every workload of the vocabulary
within the first nine (so small scenarios still see every kind of model); entries 17–32 are
quantised variants with smaller footprints and slightly lower suitability. Artifact
identities (SHA-256 and an exact ``hf://`` source) are derived from the model id, so they are
immutable and identical across seeds and fleets; nothing is ever fetched from them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from grid_core.demand.features import Modality
from grid_core.profile import ModelProfile, validate_profile

BASELINE_MODEL = "general-8b"
"""The configured baseline: operations traffic names it directly, and it keeps one replica."""

QUANT_MEMORY_FACTOR = 0.6
"""A 4-bit variant needs roughly 60 % of the base entry's resident memory."""
QUANT_SCORE_FACTOR = 0.9
"""…and loses about a tenth of its suitability."""
VLLM_MEMORY_FACTOR = 1.3
"""vLLM pre-allocates KV cache: budget 30 % more resident memory than llama.cpp."""
MB_PER_GB = 1024


@dataclass(frozen=True)
class CatalogEntry:
    """One model of the catalog and its serving physics.

    Attributes:
        profile: the production profile given to the controller.
        modality: what requests it serves (text, image, video, embedding).
        base_s: fixed device seconds per request on a reference (speed 1.0) machine.
        per_unit_s: device seconds per output unit on the reference machine.
    """

    profile: ModelProfile
    modality: Modality
    base_s: float
    per_unit_s: float

    @property
    def model_id(self) -> str:
        """The model id."""
        return self.profile.model_id


_Row = tuple[
    str,
    Modality,
    float,
    tuple[str, ...],
    tuple[str, ...],
    float,
    int,
    float,
    float,
    float,
    dict[str, float],
]
"""(id, modality, GB, runtimes, backends, gpu GB, slots, base_s, per_unit_s, SLO s, scores)."""

_BASE: tuple[_Row, ...] = (
    (
        "general-8b",
        "text",
        7,
        ("llama.cpp", "vllm"),
        (),
        0,
        4,
        0.4,
        0.02,
        30,
        {"general": 0.8, "marketing": 0.6, "sales": 0.65, "research": 0.5, "coding": 0.45},
    ),
    (
        "code-14b",
        "text",
        12,
        ("llama.cpp", "vllm"),
        (),
        0,
        4,
        0.5,
        0.035,
        40,
        {"coding": 0.95, "research": 0.4, "general": 0.4},
    ),
    (
        "embed-small",
        "embedding",
        1,
        ("llama.cpp", "vllm"),
        (),
        0,
        16,
        0.05,
        0.0,
        2,
        {"embedding": 0.9},
    ),
    (
        "image-sdxl",
        "image",
        10,
        ("comfyui",),
        (),
        0,
        1,
        8.0,
        0.0,
        60,
        {"image": 0.85, "design": 0.8},
    ),
    (
        "research-32b",
        "text",
        22,
        ("llama.cpp", "vllm"),
        (),
        0,
        2,
        0.8,
        0.06,
        60,
        {"research": 0.95, "general": 0.7, "coding": 0.55, "marketing": 0.5},
    ),
    (
        "writer-12b",
        "text",
        10,
        ("llama.cpp", "vllm"),
        (),
        0,
        4,
        0.5,
        0.03,
        40,
        {"marketing": 0.95, "sales": 0.9, "general": 0.65},
    ),
    ("video-wan", "video", 20, ("comfyui",), ("cuda",), 20, 1, 90.0, 0.0, 600, {"video": 0.9}),
    (
        "assistant-3b",
        "text",
        3,
        ("llama.cpp", "vllm"),
        (),
        0,
        6,
        0.2,
        0.01,
        20,
        {"general": 0.55, "sales": 0.5, "coding": 0.3},
    ),
    (
        "code-32b",
        "text",
        22,
        ("llama.cpp", "vllm"),
        (),
        0,
        2,
        0.8,
        0.06,
        60,
        {"coding": 1.0, "research": 0.5},
    ),
    (
        "general-70b",
        "text",
        45,
        ("vllm",),
        ("cuda",),
        40,
        8,
        1.0,
        0.05,
        60,
        {"general": 1.0, "research": 0.9, "marketing": 0.8, "sales": 0.8, "coding": 0.75},
    ),
    (
        "image-flux",
        "image",
        24,
        ("comfyui",),
        ("cuda",),
        24,
        1,
        12.0,
        0.0,
        60,
        {"image": 1.0, "design": 0.9},
    ),
    (
        "embed-large",
        "embedding",
        3,
        ("llama.cpp", "vllm"),
        (),
        0,
        16,
        0.1,
        0.0,
        2,
        {"embedding": 1.0},
    ),
    (
        "illustrator-xl",
        "image",
        12,
        ("comfyui",),
        (),
        0,
        1,
        9.0,
        0.0,
        60,
        {"design": 0.95, "image": 0.7},
    ),
    ("video-ltx", "video", 14, ("comfyui",), (), 0, 1, 60.0, 0.0, 600, {"video": 0.75}),
    (
        "mistral-24b",
        "text",
        18,
        ("llama.cpp", "vllm"),
        (),
        0,
        4,
        0.6,
        0.04,
        45,
        {"general": 0.85, "marketing": 0.75, "sales": 0.75, "research": 0.7, "coding": 0.6},
    ),
    (
        "code-7b",
        "text",
        6,
        ("llama.cpp", "vllm"),
        (),
        0,
        4,
        0.3,
        0.015,
        30,
        {"coding": 0.8, "general": 0.3},
    ),
)
CATALOG_SIZE = 2 * len(_BASE)
"""32: every base entry plus its quantised variant."""


def _sha(model_id: str) -> str:
    return hashlib.sha256(f"grid-scenario-artifact/{model_id}".encode()).hexdigest()


def _entry(row: _Row, quant: bool) -> CatalogEntry:
    mid, modality, gb, runtimes, backends, gpu_gb, slots, base_s, per_unit, slo_s, scores = row
    mem = int(gb * MB_PER_GB * (QUANT_MEMORY_FACTOR if quant else 1.0))
    if quant:
        mid = f"{mid}-q4"
        scores = {w: round(s * QUANT_SCORE_FACTOR, 3) for w, s in scores.items()}
    baseline = mid == BASELINE_MODEL
    typical_s = base_s + per_unit * 300
    profile = ModelProfile(
        model_id=mid,
        memory_mb=mem,
        runtime_memory_mb={"vllm": int(mem * VLLM_MEMORY_FACTOR)} if "vllm" in runtimes else {},
        artifact_sha256=_sha(mid),
        artifact_source=f"hf://grid-scenario/catalog/{mid}.gguf",
        artifact_size_mb=max(1, int(mem * 0.9)),
        runtimes=tuple(runtimes),
        backends=tuple(backends),
        min_gpu_count=1 if gpu_gb else 0,
        min_gpu_memory_mb=int(gpu_gb * MB_PER_GB * (QUANT_MEMORY_FACTOR if quant else 1.0)),
        min_replicas=1 if baseline else 0,
        max_replicas=8,
        priority=10 if baseline else 0,
        replica_concurrency=slots,
        expected_service_time_s=round(typical_s, 3),
        latency_slo_ms=slo_s * 1000.0,
        load_estimate_s=round(5 + mem / 1024 * 1.5, 1),
        warm_estimate_s=round(3 + mem / 1024 * 0.5, 1),
        workload_scores=dict(scores),
    )
    return CatalogEntry(validate_profile(profile), modality, base_s, per_unit)


def build_catalog(models: int) -> tuple[CatalogEntry, ...]:
    """The first ``models`` catalog entries (1–32), base entries first.

    Raises:
        ValueError: ``models`` is outside 1–32 (the CLI validates the flag first).
    """
    if not 1 <= models <= CATALOG_SIZE:
        msg = f"models={models}: the catalog holds 1 to {CATALOG_SIZE} models"
        raise ValueError(msg)
    rows = [_entry(r, False) for r in _BASE] + [_entry(r, True) for r in _BASE]
    return tuple(rows[:models])
