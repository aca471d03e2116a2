"""Independent seeded random streams.

Each concern (topology, catalog, personas, arrivals, events, outcomes) draws from its own
generator derived from the root seed and the stream's name. Changing the fleet size therefore
consumes nothing from the arrivals stream, so the users' requests stay identical (the
specification's scenario lab keeps users and arrivals fixed while the fleet varies).
"""

from __future__ import annotations

import hashlib
import math
import random

STREAMS = ("topology", "catalog", "personas", "arrivals", "events", "outcomes")
"""Every stream the lab uses; a new concern gets a new name, never a shared generator."""

POISSON_EXACT_LIMIT = 30.0
"""Above this mean the normal approximation is used (its error is far below the noise)."""


def stream(seed: int, name: str, *parts: object) -> random.Random:
    """A generator private to ``name`` (and optional sub-keys) under the root ``seed``.

    Args:
        seed: the scenario's root seed.
        name: one of :data:`STREAMS`.
        parts: extra keys (a workload name, a user index) for a sub-stream.

    Raises:
        ValueError: ``name`` is not a known stream (a typo would silently share state).
    """
    if name not in STREAMS:
        msg = f"unknown random stream {name!r}; use one of {STREAMS}"
        raise ValueError(msg)
    key = "/".join([str(seed), name, *map(str, parts)]).encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw with the given mean (deterministic for a given generator state)."""
    if mean <= 0.0:
        return 0
    if mean > POISSON_EXACT_LIMIT:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k
