"""Scenario bounds: a value outside a bound is refused with the flag named."""

from __future__ import annotations

import pytest

from grid_core.errors import ValidationError
from grid_core.scenario.config import ScenarioConfig, parse_duration


@pytest.mark.parametrize(
    ("kw", "flag"),
    [
        ({"machines": 0}, "--machines"),
        ({"machines": 65}, "--machines"),
        ({"models": 0}, "--models"),
        ({"models": 33}, "--models"),
        ({"users": 0}, "--users"),
        ({"users": 10_001}, "--users"),
        ({"duration_s": 5 * 60.0}, "--duration"),
        ({"duration_s": 24 * 3600.0 + 60}, "--duration"),
        ({"strategy": "clever"}, "--strategy"),
        ({"seed": -1}, "--seed"),
        ({"oracle": True, "machines": 5}, "--machines"),
        ({"oracle": True, "machines": 4, "models": 10}, "--models"),
        ({"oracle": True, "machines": 4, "models": 9, "duration_s": 241 * 60.0}, "--duration"),
    ],
)
def test_out_of_bounds_names_the_flag(kw: dict, flag: str) -> None:
    with pytest.raises(ValidationError, match=flag):
        ScenarioConfig(**kw).validate()


def test_the_edges_are_accepted() -> None:
    ScenarioConfig(machines=64, models=32, users=10_000, duration_s=24 * 3600.0).validate()
    ScenarioConfig(machines=1, models=1, users=1, duration_s=6 * 60.0).validate()
    ScenarioConfig(machines=4, models=9, duration_s=240 * 60.0, oracle=True).validate()


@pytest.mark.parametrize(
    ("text", "seconds"), [("30m", 1800), ("2h", 7200), ("90s", 90), ("45", 2700), ("1.5h", 5400)]
)
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2d", "h", "-3m", "ten minutes"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValidationError, match="--duration"):
        parse_duration(text)
