"""Scenario settings and their bounds: what ``grid test scenario`` accepts.

Every bound is a named constant; a value outside it is a
:class:`~grid_core.errors.ValidationError` whose message names the command-line flag and the
accepted range, so the operator can fix the one flag that was wrong. Source: the
specification's "Single-machine scenario lab and logical fleet test".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from grid_core.errors import ValidationError

Strategy = Literal["smart", "reactive", "greedy", "static"]
STRATEGIES: tuple[Strategy, ...] = ("smart", "reactive", "greedy", "static")
"""The four controls every scenario can run; graduate runs all of them."""


def parse_strategy(value: str) -> Strategy:
    """The strategy named by ``--strategy``.

    Raises:
        ValidationError: ``value`` is not one of :data:`STRATEGIES` (the message names the flag).
    """
    for strategy in STRATEGIES:
        if value == strategy:
            return strategy
    msg = f"--strategy: {value!r} is unknown; use one of {', '.join(STRATEGIES)}"
    raise ValidationError(msg)


MIN_MACHINES, MAX_MACHINES = 1, 64
"""64 logical machines is the largest planning pass the lab promises to finish quickly."""
MIN_MODELS, MAX_MODELS = 1, 32
"""The catalog holds 32 distinct models; more would repeat entries."""
MIN_USERS, MAX_USERS = 1, 10_000
"""10,000 users keeps a 24-hour run's arrival list within a few million requests."""
MIN_DURATION_S, MAX_DURATION_S = 6 * 60, 24 * 3600
"""Six minutes covers every workday phase at least once; 24 hours is one whole day."""
SEED_LIMIT = 2**63
"""One past the largest seed: a seed is a non-negative signed 64-bit integer, so it is kept
exactly in the JSON report and in every random stream derived from it."""
TICK_S = 60.0
"""One planning tick per simulated minute (the controller's default cadence)."""
ORACLE_MAX_MACHINES = 4
ORACLE_MAX_MODELS = 9
ORACLE_MAX_DURATION_S = 240 * 60
"""Oracle bounds: 4 one-model machines x (9 models + empty) is 10^4 placements per block,
the most an exhaustive per-block search can score in seconds; 240 minutes is 120 blocks."""
MAX_TRACES = 9
"""At most one trace per workload of the vocabulary."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, None: 60.0}


def parse_duration(text: str, flag: str = "--duration") -> float:
    """Parse ``30m``, ``2h``, ``90s`` (a bare number means minutes) into seconds.

    Raises:
        ValidationError: the text is not a duration; the message names ``flag``.
    """
    m = _DURATION.match(text or "")
    if not m:
        msg = f"{flag}: {text!r} is not a duration; use forms like 30m, 2h or 600s"
        raise ValidationError(msg)
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def _check_range(flag: str, value: float, lo: float, hi: float, unit: str = "") -> None:
    if not lo <= value <= hi:
        msg = f"{flag}: {value:g}{unit} is out of range; use {lo:g}{unit} to {hi:g}{unit}"
        raise ValidationError(msg)


@dataclass(frozen=True)
class ScenarioConfig:
    """One scenario run's settings (validated by :meth:`validate`).

    Attributes:
        machines: logical machines in the fleet (1–64).
        models: catalog models configured (1–32).
        users: simulated users (1–10,000).
        duration_s: simulated time in seconds (6 minutes – 24 hours).
        seed: the root of every independent random stream.
        strategy: the control strategy.
        traces: workload → (timestamp seconds, rate) series replacing that workload's curve.
        oracle: also compute the hindsight oracle (bounded, see ``ORACLE_MAX_*``).
        include_comfyui: the last machine is a ComfyUI media machine, the twin of the
            logical fleet's ``grid test start --include-comfyui`` media node.
    """

    machines: int = 8
    models: int = 8
    users: int = 50
    duration_s: float = 30 * 60.0
    seed: int = 42
    strategy: Strategy = "smart"
    traces: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    oracle: bool = False
    include_comfyui: bool = False

    @property
    def ticks(self) -> int:
        """Planning ticks in the run (one per simulated minute)."""
        return int(self.duration_s // TICK_S)

    def validate(self) -> ScenarioConfig:
        """Check every bound; return ``self`` for chaining.

        Raises:
            ValidationError: names the flag (``--machines`` …) and the accepted range.
        """
        _check_range("--machines", self.machines, MIN_MACHINES, MAX_MACHINES)
        _check_range("--models", self.models, MIN_MODELS, MAX_MODELS)
        _check_range("--users", self.users, MIN_USERS, MAX_USERS)
        _check_range(
            "--duration", self.duration_s / 60, MIN_DURATION_S / 60, MAX_DURATION_S / 60, " min"
        )
        parse_strategy(self.strategy)
        check_seed("--seed", self.seed)
        if len(self.traces) > MAX_TRACES:
            msg = f"--workload-trace: {len(self.traces)} traces; give at most {MAX_TRACES}"
            raise ValidationError(msg)
        if self.oracle:
            _check_oracle(self)
        if self.include_comfyui and self.machines < 2:
            msg = (
                f"--machines {self.machines} --include-comfyui: the media machine is one of the "
                "machines; use --machines 2 or more"
            )
            raise ValidationError(msg)
        return self


def _check_oracle(cfg: ScenarioConfig) -> None:
    if cfg.machines > ORACLE_MAX_MACHINES:
        msg = (
            f"--machines: {cfg.machines} is too many for --oracle; use at most "
            f"{ORACLE_MAX_MACHINES} (the oracle scores every placement exhaustively)"
        )
        raise ValidationError(msg)
    if cfg.models > ORACLE_MAX_MODELS:
        msg = f"--models: {cfg.models} is too many for --oracle; use at most {ORACLE_MAX_MODELS}"
        raise ValidationError(msg)
    if cfg.duration_s > ORACLE_MAX_DURATION_S:
        msg = (
            f"--duration: {cfg.duration_s / 60:g} min is too long for --oracle; use at most "
            f"{ORACLE_MAX_DURATION_S // 60} min"
        )
        raise ValidationError(msg)


def check_seed(flag: str, seed: int) -> None:
    """Refuse a seed outside ``[0, SEED_LIMIT)``.

    Args:
        flag: the flag that gave it (``--seed``, or ``--seeds`` for graduate and exact).
        seed: the seed.

    Raises:
        ValidationError: naming ``flag``, the seed and the accepted range.
    """
    if not 0 <= seed < SEED_LIMIT:
        msg = f"{flag}: {seed} is out of range; use 0 to 2^63-1"
        raise ValidationError(msg)
