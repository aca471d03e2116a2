"""The seeded workday and the arrival trace every strategy replays.

The workday has six phases over the run (fractions of its duration): a morning ramp, a coding
surge, a creative campaign (with a thermal throttle overlapping its end), a node outage, a
recovery and a cooldown. Arrivals are drawn once per scenario from the ``arrivals`` stream and
are identical for every strategy; their digest goes into the report so that is checkable.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass

from grid_core.demand.features import EndpointFamily, Modality
from grid_core.scenario.config import TICK_S
from grid_core.scenario.personas import PERSONAS, User, stage_now
from grid_core.scenario.streams import poisson, stream
from grid_core.scenario.traces import Series, TraceCurve

PHASES: tuple[tuple[str, float, float], ...] = (
    ("morning_ramp", 0.00, 0.15),
    ("coding_surge", 0.15, 0.35),
    ("creative_campaign", 0.35, 0.55),
    ("thermal_throttle", 0.45, 0.60),
    ("node_outage", 0.55, 0.70),
    ("recovery", 0.70, 0.85),
    ("cooldown", 0.85, 1.00),
)
"""(name, start, end) as fractions of the run; the throttle overlaps the campaign's end."""

SURGE: dict[str, dict[str, float]] = {
    "coding_surge": {"coding": 3.0, "research": 1.5},
    "creative_campaign": {"image": 3.0, "video": 4.0, "design": 2.5, "marketing": 2.0},
}
"""Demand multipliers per phase and workload (others stay at 1.0)."""
MORNING_START = 0.6
"""The morning ramp starts at 60 % of the baseline rate and reaches 100 % by its end."""
COOLDOWN_LEVEL = 0.35
"""Evening demand: about a third of the daytime baseline."""


def phase_at(x: float) -> tuple[str, ...]:
    """Names of the phases active at fraction ``x`` of the run."""
    return tuple(name for name, lo, hi in PHASES if lo <= x < hi)


def builtin_shape(workload: str, x: float) -> float:
    """Built-in relative demand of ``workload`` at fraction ``x`` of the run."""
    level = 1.0
    if x < PHASES[0][2]:
        level = MORNING_START + (1.0 - MORNING_START) * x / PHASES[0][2]
    for name in phase_at(x):
        level *= SURGE.get(name, {}).get(workload, 1.0)
    if "cooldown" in phase_at(x):
        level *= COOLDOWN_LEVEL
    return level


def builtin_mean(workload: str, samples: int = 1000) -> float:
    """Mean of the built-in curve over the run (a trace is scaled to this mean)."""
    return sum(builtin_shape(workload, (i + 0.5) / samples) for i in range(samples)) / samples


class DemandCurves:
    """Relative demand per workload over the run; traces replace built-in curves."""

    def __init__(self, traces: dict[str, Series] | None = None) -> None:
        self._traces = {w: TraceCurve(s) for w, s in (traces or {}).items()}
        self._means = {w: builtin_mean(w) for w in self._traces}

    def level(self, workload: str, x: float) -> float:
        """Relative demand of ``workload`` at fraction ``x``."""
        trace = self._traces.get(workload)
        if trace is None:
            return builtin_shape(workload, x)
        return self._means[workload] * trace.shape(x)

    @property
    def replaced(self) -> tuple[str, ...]:
        """Workloads whose curve comes from a trace."""
        return tuple(sorted(self._traces))


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of the trace (sizes in tokens / images / video seconds).

    ``persona`` is kept only for per-user reporting; the controller sees what the
    classifier derives from ``endpoint``, ``modality``, the units and the text.
    """

    minute: int
    offset_s: float
    user: int
    persona: str
    requested_model: str
    endpoint: EndpointFamily
    modality: Modality
    input_units: int
    output_units: int
    template: int
    project: int

    def row(self) -> str:
        """Canonical text of this arrival for the trace digest."""
        return (
            f"{self.minute},{self.offset_s:.6f},{self.user},{self.persona},"
            f"{self.requested_model},{self.endpoint},{self.modality},{self.input_units},"
            f"{self.output_units},{self.template},{self.project}"
        )


def _units(rng: random.Random, typical: int) -> int:
    if typical <= 1:
        return typical
    return max(1, int(typical * rng.uniform(0.4, 1.6)))


def iter_arrivals(
    seed: int, users: tuple[User, ...], ticks: int, curves: DemandCurves
) -> Iterator[tuple[Arrival, ...]]:
    """Arrivals minute by minute, drawn only from the ``arrivals`` stream.

    Per minute and persona the count is Poisson with mean ``users x rate x curve``; each
    request then picks a user of that persona (one whose project is in the persona's work
    stage this minute, when any is: see :func:`~grid_core.scenario.personas.stage_now`), an
    offset within the minute, a text template and sizes. Stages move only who asks, never
    how many requests there are. The result depends on neither the fleet nor the strategy.
    Yielding one minute at a time keeps a 24-hour, 10,000-user run from holding millions of
    arrivals at once.

    Yields:
        One tuple of arrivals per minute, sorted by offset.
    """
    rng = stream(seed, "arrivals")
    groups = {p.name: [u for u in users if u.persona.name == p.name] for p in PERSONAS}
    for minute in range(ticks):
        x = (minute + 0.5) / ticks
        batch: list[Arrival] = []
        for p in PERSONAS:
            members = groups[p.name]
            if not members:
                continue
            mean = len(members) * p.rate_per_h / 60.0 * curves.level(p.curve or p.name, x)
            staged = [u for u in members if stage_now(p.name, u.project, minute)] or members
            for _ in range(poisson(rng, mean)):
                u = staged[rng.randrange(len(staged))]
                batch.append(
                    Arrival(
                        minute,
                        round(rng.uniform(0.0, TICK_S), 6),
                        u.index,
                        p.name,
                        p.requested_model,
                        p.endpoint,
                        p.modality,
                        _units(rng, p.input_units),
                        _units(rng, p.output_units),
                        rng.randrange(len(p.texts)),
                        u.project,
                    )
                )
        batch.sort(key=lambda a: (a.offset_s, a.user))
        yield tuple(batch)


def build_arrivals(
    seed: int, users: tuple[User, ...], ticks: int, curves: DemandCurves
) -> tuple[tuple[Arrival, ...], ...]:
    """All of :func:`iter_arrivals` at once (tests and the oracle's bounded runs)."""
    return tuple(iter_arrivals(seed, users, ticks, curves))


class TraceDigest:
    """Incremental SHA-256 over arrivals in order (same value as :func:`arrivals_digest`)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.count = 0

    def add(self, batch: tuple[Arrival, ...]) -> None:
        """Fold one minute of arrivals."""
        for a in batch:
            self._h.update(a.row().encode())
            self._h.update(b"\n")
        self.count += len(batch)

    def hexdigest(self) -> str:
        """The digest so far."""
        return self._h.hexdigest()


def arrivals_digest(arrivals: tuple[tuple[Arrival, ...], ...]) -> str:
    """SHA-256 over every arrival's canonical row, in order."""
    digest = TraceDigest()
    for batch in arrivals:
        digest.add(batch)
    return digest.hexdigest()


@dataclass(frozen=True)
class FleetEvents:
    """Seeded physical events: which machines throttle and which go down, and when.

    Attributes:
        throttled: host ids slowed (half speed) during the thermal-throttle phase.
        outage: host ids that stop (processes lost, cache kept) during the node outage.
        throttle_ticks / outage_ticks: ``(first, last_exclusive)`` tick ranges.
    """

    throttled: tuple[str, ...]
    outage: tuple[str, ...]
    throttle_ticks: tuple[int, int]
    outage_ticks: tuple[int, int]


THROTTLE_SHARE = 0.25
"""A quarter of the fleet overheats: enough to matter, not a total loss."""
OUTAGE_SHARE = 0.125
"""One machine in eight goes down (at least one)."""


def _ticks_of(phase: str, ticks: int) -> tuple[int, int]:
    for name, lo, hi in PHASES:
        if name == phase:
            return int(lo * ticks), max(int(lo * ticks) + 1, int(hi * ticks))
    raise KeyError(phase)


def build_events(seed: int, host_ids: tuple[str, ...], ticks: int) -> FleetEvents:
    """Pick throttled and failing machines from the ``events`` stream."""
    rng = stream(seed, "events")
    n = len(host_ids)
    throttled = tuple(sorted(rng.sample(host_ids, max(1, int(n * THROTTLE_SHARE)))))
    outage = tuple(sorted(rng.sample(host_ids, max(1, int(n * OUTAGE_SHARE)))))
    return FleetEvents(
        throttled, outage, _ticks_of("thermal_throttle", ticks), _ticks_of("node_outage", ticks)
    )
