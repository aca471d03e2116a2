"""Stateful property test: the real controller (and real planner) over a simulated fleet.

Random heartbeats, receipts (duplicated, reordered, delayed), failures, requests, host loss
and return, owner reclaim, profile changes, mode changes, controller restarts and a
superseded controller that keeps sending — and after every step the safety invariants hold.
"""

from __future__ import annotations

import hypothesis.strategies as st
from controller_sim import SimFleet
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from grid_core.errors import ConflictError
from grid_core.profile import ModelProfile

HOSTS = {"h1": 12_000, "h2": 12_000, "h3": 16_000, "h4": 8_000}
MODELS = {"a": 5000, "b": 4000, "c": 6000}
host_ids = st.sampled_from(sorted(HOSTS))
model_ids = st.sampled_from(sorted(MODELS))


class FleetMachine(RuleBasedStateMachine):
    """Drive a small fleet; the simulated nodes record any harm the controller asks for."""

    @initialize()
    def start(self) -> None:
        self.fleet = SimFleet(dict(HOSTS))
        for h in self.fleet.nodes:
            self.fleet.heartbeat(h)
        self.fleet.put_profile(ModelProfile(model_id="a", memory_mb=MODELS["a"],
                                            min_replicas=1, max_replicas=2,
                                            min_residency_s=10.0))
        self.fleet.put_profile(ModelProfile(model_id="b", memory_mb=MODELS["b"],
                                            min_replicas=1, max_replicas=1,
                                            min_residency_s=10.0))
        self.fleet.ctl.set_mode("automatic", self.fleet.now)
        self.max_term = 0

    # --- time and heartbeats --------------------------------------------------------------
    @rule(seconds=st.sampled_from([1.0, 5.0, 15.0, 40.0, 100.0]))
    def advance(self, seconds: float) -> None:
        self.fleet.now += seconds

    @rule(host=host_ids, order=st.sampled_from(["all", "reverse", "duplicate", "partial"]))
    def heartbeat(self, host: str, order: str) -> None:
        self.fleet.heartbeat(host, ack_order=order)

    @rule(host=host_ids)
    def receipts_with_an_old_report(self, host: str) -> None:
        self.fleet.stale_heartbeat(host)

    @rule(placement=st.dictionaries(model_ids, st.lists(host_ids, max_size=3, unique=True)))
    def adversarial_plan(self, placement: dict[str, list[str]]) -> None:
        # Any placement at all, even one that overcommits hosts or moves every replica:
        # the reconciler alone must keep it safe.
        self.fleet.override = placement

    @rule()
    def real_planner(self) -> None:
        self.fleet.override = None

    @rule(fail=st.booleans())
    def fleet_round(self, fail: bool) -> None:
        # Ten seconds of a well-behaved fleet: every up host heartbeats, every started
        # action finishes (the first one fails when ``fail``). Lets the machine make
        # progress between perturbations instead of only ever starting work.
        fleet = self.fleet
        fleet.now += 10.0
        for h in sorted(fleet.nodes):
            fleet.heartbeat(h)
        first = fail
        for h in sorted(fleet.nodes):
            while fleet.nodes[h].up and fleet.nodes[h].started:
                fleet.complete(h, fail=first)
                first = False

    @rule()
    def tick(self) -> None:
        self.fleet.tick()

    @rule(host=host_ids, fail=st.booleans())
    def node_finishes(self, host: str, fail: bool) -> None:
        self.fleet.complete(host, fail=fail)

    @rule(host=host_ids, model=model_ids, delta=st.sampled_from([1, 2, -1, -2]))
    def requests(self, host: str, model: str, delta: int) -> None:
        self.fleet.run_requests(host, model, delta)

    # --- membership and host lifecycle ------------------------------------------------------
    @rule(host=host_ids)
    def host_lost(self, host: str) -> None:
        self.fleet.nodes[host].up = False

    @rule(host=host_ids)
    def host_returns(self, host: str) -> None:
        self.fleet.nodes[host].up = True

    @rule(host=host_ids, state=st.sampled_from(["accepting", "throttled", "paused", "draining",
                                                "unhealthy", "accepting"]))
    def host_lifecycle(self, host: str, state: str) -> None:
        self.fleet.nodes[host].lifecycle = state

    # --- operator -------------------------------------------------------------------------
    @rule(model=model_ids, lo=st.integers(0, 2), extra=st.integers(0, 1),
          prio=st.integers(0, 2))
    def put_profile(self, model: str, lo: int, extra: int, prio: int) -> None:
        self.fleet.put_profile(ModelProfile(model_id=model, memory_mb=MODELS[model],
                                            min_replicas=lo, max_replicas=max(1, lo + extra),
                                            priority=prio, min_residency_s=10.0))

    @precondition(lambda self: bool(self.fleet.profiles))
    @rule(data=st.data())
    def remove_profile(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(sorted(self.fleet.profiles)))
        self.fleet.remove_profile(model)

    @rule(mode=st.sampled_from(["observe", "recommend", "automatic", "automatic"]))
    def set_mode(self, mode: str) -> None:
        try:
            self.fleet.ctl.set_mode(mode, self.fleet.now)
        except ConflictError:
            # A live superseded controller still holds the lease: refusal is the safe answer.
            assert mode == "automatic" and self.fleet.zombies
            assert self.fleet.ctl.mode != "automatic"

    @rule(keep_zombie=st.booleans())
    def restart_controller(self, keep_zombie: bool) -> None:
        self.fleet.restart(keep_zombie=keep_zombie)

    @rule(host=host_ids)
    def superseded_controller_sends(self, host: str) -> None:
        self.fleet.zombie_deliver(host)

    # --- invariants -------------------------------------------------------------------------
    @invariant()
    def nothing_harmful_was_asked(self) -> None:
        # Covers: no overcommitting warm, no drain of the last ready required replica, no
        # unload with requests in flight, no command to a non-accepting host, no duplicate
        # warm/drain/unload of the same residency.
        assert self.fleet.violations == []

    @invariant()
    def memory_never_overcommitted(self) -> None:
        assert self.fleet.overcommitted() == []

    @invariant()
    def authority_only_moves_forward(self) -> None:
        # A node receiving a lower term than it has seen is recorded as a violation (and
        # rejected); the current lineage of controllers never sends a term backwards.
        assert self.fleet.terms_sent == sorted(self.fleet.terms_sent)
        for node in self.fleet.nodes.values():
            for c in node.started.values():
                assert c.controller_term <= node.highest_term

    @invariant()
    def one_active_action_per_identity(self) -> None:
        active = self.fleet.ctl.book.active()
        keys = [(a.kind, a.host_id, a.model_id) for a in active]
        assert len(keys) == len(set(keys))

    @invariant()
    def commands_only_in_automatic_mode(self) -> None:
        if self.fleet.ctl.mode != "automatic":
            assert self.fleet.ctl.book.active() == []


FleetMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestFleet = FleetMachine.TestCase
