"""Controller soak: the stateful property test (``test_controller_stateful``) run for a step
budget instead of a fixed number of examples, with a printed report.

``make soak`` runs it for 10,000 steps on fresh random fleets (``GRID_SOAK_STEPS`` sets the
budget) and prints progress, the steps taken, how many of
them were perturbations (everything but a well-behaved convergence round: heartbeats with
reordered, duplicated or stale receipts, failed actions, requests, host loss and owner
reclaim, planner overrides that overcommit, profile and mode changes, controller restarts,
superseded controllers) and the violations found. Any violation fails the soak with
Hypothesis's shrunk counter-example. Without ``GRID_SOAK_STEPS`` (``make test`` and CI) a
shorter, derandomized run keeps the report path itself tested.
"""

from __future__ import annotations

import os
import time

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from test_controller_stateful import (
    CONVERGENCE_RULES,
    NODE_REFUSALS,
    TALLY,
    UNOBSERVABLE_LOSSES,
    FleetMachine,
)

SOAK_STEPS_ENV = "GRID_SOAK_STEPS"
CI_STEPS = 1000
"""Steps of the derandomized run inside ``make test``: enough to pass through every rule
many times (seconds on a loaded 2-core machine), far below the soak's 10,000."""
STEPS_PER_RUN = 100
"""Longest sequence of steps from one fleet before a fresh fleet is drawn. Long enough for a
host to be lost, reclaimed and return while a controller restarts; Hypothesis may end a run
sooner, so the soak counts the steps actually taken."""
RUNS_PER_BATCH = 10
"""Fleets per Hypothesis call; progress is printed after each batch."""


def _report_line(label: str, steps: int, runs: int, started: float) -> str:
    perturbations = sum(n for rule, n in TALLY.items() if rule not in CONVERGENCE_RULES)
    return (
        f"soak {label}: {steps} steps, {perturbations} perturbations, {runs} fleets, "
        f"0 violations, {time.monotonic() - started:.0f} s"
    )


def run_soak(target_steps: int, *, derandomize: bool) -> dict[str, object]:
    """Run the stateful controller test until at least ``target_steps`` rule steps were taken
    (the last batch may overshoot by less than one batch).

    Returns:
        ``steps``, ``perturbations``, ``fleets``, ``violations`` (0: a violation raises
        Hypothesis's failing example instead), ``seconds``, ``by_rule`` and
        ``node_refusals`` (stale commands the simulated nodes refused, by kind) and
        ``unobservable_losses`` (drains decided on a replacement's valid report that was
        lost before the drain began: its engine died or its host stopped accepting).
    """
    TALLY.clear()
    NODE_REFUSALS.clear()
    UNOBSERVABLE_LOSSES.clear()
    started = time.monotonic()
    runs = 0
    batch = 0
    while sum(TALLY.values()) < target_steps:
        batch += 1
        left = target_steps - sum(TALLY.values())
        examples = max(1, min(RUNS_PER_BATCH, -(-left // STEPS_PER_RUN)))
        cfg = settings(
            max_examples=examples,
            stateful_step_count=STEPS_PER_RUN,
            deadline=None,
            derandomize=derandomize,
            database=None,
            # fresh fleets only (no example database to replay); a failure still shrinks.
            phases=[Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
        )
        run_state_machine_as_test(FleetMachine, settings=cfg)
        runs += examples
        print(_report_line("progress", sum(TALLY.values()), runs, started), flush=True)
        if derandomize:
            break  # a derandomized batch would repeat itself: one pass is the CI run
    steps = sum(TALLY.values())
    return {
        "steps": steps,
        "perturbations": sum(n for r, n in TALLY.items() if r not in CONVERGENCE_RULES),
        "fleets": runs,
        "violations": 0,
        "seconds": round(time.monotonic() - started, 1),
        "by_rule": dict(sorted(TALLY.items())),
        "node_refusals": dict(sorted(NODE_REFUSALS.items())),
        "unobservable_losses": sum(UNOBSERVABLE_LOSSES.values()),
    }


def test_controller_soak_keeps_every_safety_invariant() -> None:
    raw = os.environ.get(SOAK_STEPS_ENV)
    soak = raw is not None
    target = int(raw) if raw else CI_STEPS
    report = run_soak(target, derandomize=not soak)
    print(
        f"soak done: {report['steps']} steps, {report['perturbations']} perturbations, "
        f"{report['fleets']} fleets, {report['violations']} violations, "
        f"{report['seconds']} s wall"
    )
    for rule, n in report["by_rule"].items():  # type: ignore[attr-defined]  # dict from run_soak
        print(f"  {rule:32} {n}")
    refused = report["node_refusals"]
    print(f"  stale commands refused by nodes: {refused or 'none'}")
    print(
        "  drains whose replacement was lost after its last report (no controller can see it): "
        f"{report['unobservable_losses']}"
    )
    assert report["violations"] == 0
    if soak:
        assert report["steps"] >= target
    else:
        assert report["steps"] > 0
