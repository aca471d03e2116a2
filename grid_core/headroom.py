"""Admission headroom: the free memory a new replica must leave on its host.

A flat margin cannot fit every model: a few hundred MB covers a small model's KV-cache growth
and allocator slack, but a 14 GB model admitted with 512 MB to spare on a 15 GB host swaps as
soon as its context fills. The headroom therefore grows with the replica's resident budget,
with a floor for small models, and a profile may raise it for a model known to need more
(a long context, a runtime with large scratch buffers).

Source: the specification's "Safety invariants" 1 (policy headroom fences new and resized
allocations; an existing process may stay inside it) and issue 20 (a documented
proportional default with a floor, overridable per profile).
"""

from __future__ import annotations

import math

ADMISSION_HEADROOM_MB = 512
"""Floor of the headroom (MB): room for KV-cache growth and allocator slack of even the
smallest model, so a fresh load cannot push a host into swapping. Every host keeps at least
this much free of new allocations whatever the profiles say."""
ADMISSION_HEADROOM_FRACTION = 0.10
"""Proportional part: a tenth of the replica's resident budget. KV cache at full context,
compute buffers and runtime overhead grow with model size; a tenth keeps a 14.6 GB model off
a 15.8 GB host (it needs 16.1 GB) while a 1 GB model still needs only the floor."""


def admission_headroom_mb(
    memory_mb: int,
    *,
    floor_mb: int = ADMISSION_HEADROOM_MB,
    fraction: float = ADMISSION_HEADROOM_FRACTION,
    override_mb: int | None = None,
) -> int:
    """Free MB a new replica of ``memory_mb`` resident MB must leave on its host.

    Args:
        memory_mb: resident budget of the new replica (MB, the runtime-specific estimate).
        floor_mb: the policy floor (MB); the result is never below it.
        fraction: the policy's proportional share of ``memory_mb`` (0 disables it).
        override_mb: the profile's own headroom (MB), replacing the proportional share; it
            cannot go below the floor, which protects the host rather than the model.

    Returns:
        ``max(floor_mb, override_mb)`` when the profile overrides, else
        ``max(floor_mb, ceil(fraction * memory_mb))`` (MB, >= 0).
    """
    floor_mb = max(0, floor_mb)
    if override_mb is not None:
        return max(floor_mb, override_mb)
    return max(floor_mb, math.ceil(max(0.0, fraction) * max(0, memory_mb)))
