"""The registration grace runs on the server's clock, like every other timed decision."""

from __future__ import annotations

from simfleet import DurableMemoryStore

from grid_core.controller import Controller
from grid_core.testing import plugins_with
from grid_server.registry import Registry
from grid_server.router import RouterState
from grid_server.runner import REGISTRATION_GRACE_S, ControllerRunner


class _Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_registration_grace_ends_when_the_servers_clock_says_so() -> None:
    clock = _Clock(5_000.0)  # far from the wall clock: a wall-clock grace would be over
    registry = Registry()
    runner = ControllerRunner(
        Controller(plugins=plugins_with(), store=DurableMemoryStore()),
        registry,
        RouterState(registry),
        clock=clock,
    )
    assert runner.registration_left_s() == REGISTRATION_GRACE_S
    clock.t += REGISTRATION_GRACE_S - 10.0
    assert runner.registration_left_s() == 10.0
    clock.t += 10.0
    assert runner.registration_left_s() == 0.0
