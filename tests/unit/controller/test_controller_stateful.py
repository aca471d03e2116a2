"""Stateful property test: the real controller (and real planner) over a simulated fleet.

It runs twice: against the shared state-file stand-in, and against a real etcd where every
controller instance is a separate server with its own store (elected before it restores, and a
restarted or lingering instance has lost its etcd lease).

Random heartbeats, receipts (duplicated, reordered, delayed), failures, requests, engine
deaths (also while a response is in flight), host loss and return, owner reclaim, profile
changes, mode changes, controller restarts and a superseded controller that keeps answering
heartbeats — and after every step the safety invariants hold.

The fleet itself (hosts, capacities, models, replica bounds) is drawn by Hypothesis
(:func:`fleet_strategies.sim_fleets`), so a failing run shrinks to the smallest fleet and the
shortest sequence of steps that still breaks an invariant.
"""

from __future__ import annotations

import functools
import secrets
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import hypothesis.strategies as st
import msgspec
import pytest
from etcd_process import EtcdServer, start_etcd
from fleet_strategies import SimFleetSpec, sim_fleets
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from simfleet import SimFleet

from grid_core.errors import ConflictError
from grid_core.profile import ModelProfile
from grid_core.reconcile.authority import SUPERSEDED
from grid_core.store import StateConflictError
from grid_core.system.state_etcd import EtcdSettings, EtcdStateStore

host_ids = st.sampled_from(["h1", "h2", "h3", "h4"])
"""A host by name; a name beyond the drawn fleet means its last host (see ``_host``)."""
model_ids = st.sampled_from(["a", "b", "c"])
"""A model by name; a name beyond the drawn fleet means its last model (see ``_model``)."""
F = TypeVar("F", bound=Callable[..., Any])

TALLY: Counter[str] = Counter()
"""Rules run so far in this process, by name (the soak prints it; see test_controller_soak)."""
CONVERGENCE_RULES = frozenset({"fleet_rounds"})
"""Rules that model a well-behaved fleet; every other rule is a perturbation."""
NODE_REFUSALS: Counter[str] = Counter()
UNOBSERVABLE_LOSSES: Counter[str] = Counter()
"""Drains decided on a replacement's valid report that was then lost unreported (its engine
died or its host stopped accepting), by model (see ``SimFleet.unobservable``): a race no
controller can see, counted for the soak report."""
"""Commands the simulated nodes refused when they started, by kind (a drain whose engine
died in flight); the soak prints them, to show the node-side check was exercised."""


def counted(fn: F) -> F:
    """Count each run of a rule in :data:`TALLY` (under ``@rule``, so Hypothesis sees the
    original signature through ``functools.wraps``)."""

    @functools.wraps(fn)
    def run(self: Any, **kwargs: Any) -> Any:
        TALLY[fn.__name__] += 1
        return fn(self, **kwargs)

    return run  # type: ignore[return-value]  # same signature, wrapped by functools.wraps


placements = st.none() | st.fixed_dictionaries(
    {m: st.lists(host_ids, max_size=2, unique=True) for m in ("a", "b", "c")}
)


class FleetMachine(RuleBasedStateMachine):
    """Drive a small fleet; the simulated nodes record any harm the controller asks for.

    Every controller instance shares one in-memory stand-in for the state file unless
    :meth:`store_factory` gives each instance its own store (the etcd run does).
    """

    def store_factory(self) -> Callable[[], Any] | None:
        """A factory of per-instance stores for one run, or ``None`` for the shared file."""
        return None

    @initialize(spec=sim_fleets())
    def start(self, spec: SimFleetSpec) -> None:
        self.spec = spec
        self.fleet = SimFleet(dict(spec.hosts), store_factory=self.store_factory())
        for h in self.fleet.nodes:
            self.fleet.heartbeat(h)
        for mid, m in spec.models.items():
            self.fleet.put_profile(
                ModelProfile(
                    model_id=mid,
                    memory_mb=m.memory_mb,
                    min_replicas=m.min_replicas,
                    max_replicas=m.max_replicas,
                    min_residency_s=10.0,
                )
            )
        self.fleet.ctl.set_mode("automatic", self.fleet.now)

    def _host(self, name: str) -> str:
        return name if name in self.spec.hosts else sorted(self.spec.hosts)[-1]

    def _model(self, name: str) -> str:
        return name if name in self.spec.models else sorted(self.spec.models)[-1]

    # --- a well-behaved fleet, so work actually converges between perturbations -----------
    @rule(fail=st.booleans(), rounds=st.integers(1, 3))
    @counted
    def fleet_rounds(self, fail: bool, rounds: int) -> None:
        # Ten seconds per round: every up host heartbeats, every started action finishes
        # (the very first one fails when ``fail``).
        fleet = self.fleet
        for _ in range(rounds):
            fleet.now += 10.0
            for h in sorted(fleet.nodes):
                fleet.heartbeat(h)
            for h in sorted(fleet.nodes):
                while fleet.nodes[h].up and fleet.nodes[h].started:
                    fleet.complete(h, fail=fail)
                    fail = False

    # --- perturbations ----------------------------------------------------------------------
    @rule(seconds=st.sampled_from([1.0, 5.0, 15.0, 40.0, 100.0]), tick=st.booleans())
    @counted
    def time_passes(self, seconds: float, tick: bool) -> None:
        self.fleet.now += seconds
        if tick:
            self.fleet.tick()

    @rule(
        host=host_ids,
        order=st.sampled_from(["all", "reverse", "duplicate", "partial", "old_report"]),
    )
    @counted
    def one_heartbeat(self, host: str, order: str) -> None:
        # Receipts reordered, duplicated, partly held back, or sent with an old inventory.
        if order == "old_report":
            self.fleet.stale_heartbeat(self._host(host))
        else:
            self.fleet.heartbeat(self._host(host), ack_order=order)

    @rule(host=host_ids, fail=st.booleans())
    @counted
    def one_node_finishes(self, host: str, fail: bool) -> None:
        self.fleet.complete(self._host(host), fail=fail)

    @rule(host=host_ids, model=model_ids, delta=st.sampled_from([1, 2, -1, -2]))
    @counted
    def requests(self, host: str, model: str, delta: int) -> None:
        self.fleet.run_requests(self._host(host), self._model(model), delta)

    @rule(host=host_ids, model=model_ids)
    @counted
    def engine_dies(self, host: str, model: str) -> None:
        # kill -9 of one engine: the repair path must keep priority order.
        self.fleet.engine_dies(self._host(host), self._model(model))

    @rule(host=host_ids, model=model_ids)
    @counted
    def engine_dies_in_flight(self, host: str, model: str) -> None:
        # The engine dies after its host's report left and before the response arrives: the
        # node refuses a drain decided on that report (nothing stale is executed).
        self.fleet.heartbeat(self._host(host), dies_in_flight=self._model(model))

    @rule(model=model_ids, second=st.booleans())
    @counted
    def revision_change(self, model: str, second: bool) -> None:
        # The operator rolls a model to another artifact revision (or back).
        model = self._model(model)
        current = self.fleet.profiles.get(model)
        if current is None:
            return
        sha = ("1" if second else "2") * 64
        try:
            self.fleet.put_profile(msgspec.structs.replace(current, artifact_sha256=sha))
        except StateConflictError:
            assert self.fleet.ctl.authority.superseded
            assert self.fleet.restart_if_superseded()

    @rule(host=host_ids, up=st.booleans())
    @counted
    def host_lost_or_back(self, host: str, up: bool) -> None:
        self.fleet.nodes[self._host(host)].up = up

    @rule(
        host=host_ids,
        state=st.sampled_from(
            ["accepting", "throttled", "paused", "draining", "unhealthy", "accepting"]
        ),
    )
    @counted
    def host_lifecycle(self, host: str, state: str) -> None:
        self.fleet.nodes[self._host(host)].lifecycle = state

    @rule(placement=placements)
    @counted
    def planner_output(self, placement: dict[str, list[str]] | None) -> None:
        # None: the real planner. Otherwise any placement at all, even one that overcommits
        # hosts or moves every replica: the reconciler alone must keep it safe.
        if placement is not None:
            placement = {
                m: [h for h in hosts if h in self.spec.hosts]
                for m, hosts in placement.items()
                if m in self.spec.models
            }
        self.fleet.override = placement

    @rule(host=host_ids)
    @counted
    def planner_crowds_one_host(self, host: str) -> None:
        # Every model on one host: more than any host here can hold.
        self.fleet.override = {m: [self._host(host)] for m in self.spec.models}

    # --- operator ---------------------------------------------------------------------------
    @rule(
        model=model_ids,
        lo=st.integers(0, 2),
        extra=st.integers(0, 1),
        prio=st.integers(0, 2),
        remove=st.booleans(),
    )
    @counted
    def profile_change(self, model: str, lo: int, extra: int, prio: int, remove: bool) -> None:
        model = self._model(model)
        try:
            if remove:
                if model in self.fleet.profiles:
                    self.fleet.remove_profile(model)
                return
            self.fleet.put_profile(
                ModelProfile(
                    model_id=model,
                    memory_mb=self.spec.models[model].memory_mb,
                    min_replicas=lo,
                    max_replicas=max(1, lo + extra),
                    priority=prio,
                    min_residency_s=10.0,
                )
            )
        except StateConflictError:
            # A lingering older instance wrote the state after this one loaded it: this
            # controller is superseded, refuses the change, and the operator restarts it.
            assert self.fleet.ctl.authority.superseded
            assert self.fleet.restart_if_superseded()

    @rule(mode=st.sampled_from(["observe", "recommend", "automatic", "automatic"]))
    @counted
    def set_mode(self, mode: str) -> None:
        try:
            self.fleet.ctl.set_mode(mode, self.fleet.now)
        except StateConflictError:
            # Another instance wrote the state first: this one is superseded (see above).
            assert self.fleet.ctl.authority.superseded and self.fleet.zombies
            assert self.fleet.restart_if_superseded()
        except ConflictError:
            # A live superseded controller still holds the lease: refusal is the safe answer.
            assert mode == "automatic" and self.fleet.zombies
            assert self.fleet.ctl.authority.state != "held"

    @rule(keep_zombie=st.booleans(), zombie_sends_to=host_ids)
    @counted
    def restart_controller(self, keep_zombie: bool, zombie_sends_to: str) -> None:
        self.fleet.restart(keep_zombie=keep_zombie)
        self.fleet.zombie_deliver(self._host(zombie_sends_to))

    @rule(host=host_ids)
    @counted
    def superseded_controller_sends(self, host: str) -> None:
        self.fleet.zombie_deliver(self._host(host))

    @rule()
    @counted
    def superseded_controller_ticks(self) -> None:
        # A lingering instance keeps ticking on its stale view and tries to save it.
        self.fleet.zombie_tick()

    def teardown(self) -> None:
        fleet = getattr(self, "fleet", None)
        if fleet is not None:
            NODE_REFUSALS.update(kind for _, kind, _, _ in fleet.refused)
            UNOBSERVABLE_LOSSES.update(model for _, _, model in fleet.unobservable)

    # --- invariants -------------------------------------------------------------------------
    @invariant()
    def nothing_harmful_was_asked(self) -> None:
        # Covers: no overcommitting warm, no drain of the last ready required replica, no
        # unload with requests in flight, no command to a non-accepting host, no duplicate
        # warm/drain/unload of the same residency, no drain sent against the report the
        # controller (current or superseded) had just registered. A drain that only became
        # stale in flight is refused by the node (``fleet.refused``), which is not harm.
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
    def operator_changes_survive_a_restart(self) -> None:
        # Every profile change the controller accepted is in the state the next restart
        # restores: no lingering older instance may overwrite it with its stale view.
        state = self.fleet.durable_state()
        assert state is not None
        assert {p.model_id: p for p in state.profiles} == self.fleet.profiles
        assert set(state.tombstones) == self.fleet.retired

    @invariant()
    def a_superseded_controller_commands_nothing(self) -> None:
        for c in [self.fleet.ctl, *self.fleet.zombies]:
            if c.authority.superseded:
                assert c.authority.state == SUPERSEDED
                for h in sorted(self.fleet.nodes):
                    d = c.deliver(h, self.fleet.now, self.fleet.hosts(), c.revisions.dirty)
                    assert d.commands == () and d.lease_ttl_s == 0.0

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
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFleet = FleetMachine.TestCase


ETCD_EXAMPLES = 12
"""Fewer examples on etcd than in memory: every save is two etcd round trips, and the same
rules already run 100 times against the in-memory stand-in."""


class EtcdFleetMachine(FleetMachine):
    """:class:`FleetMachine` with one etcd store per controller instance (a real etcd)."""

    server: EtcdServer | None = None

    def store_factory(self) -> Callable[[], Any] | None:
        assert self.server is not None, "the etcd_for_stateful fixture starts etcd"
        url = f"{self.server.state_store}/stateful-{secrets.token_hex(6)}"  # fresh per run
        self._stores: list[EtcdStateStore] = []

        def make() -> EtcdStateStore:
            store = EtcdStateStore(EtcdSettings.parse(url))
            self._stores.append(store)
            return store

        return make

    @invariant()
    def every_instance_writes_to_etcd(self) -> None:
        assert isinstance(self.fleet.ctl.document.store, EtcdStateStore)
        assert self.fleet.durable_state() is not None  # read back from etcd

    def teardown(self) -> None:
        super().teardown()
        for store in getattr(self, "_stores", []):
            store.close()


@pytest.fixture(scope="module")
def etcd_for_stateful(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd for every example of the etcd run, stopped by PID afterwards."""
    server = start_etcd(tmp_path_factory.mktemp("etcd-stateful"))
    EtcdFleetMachine.server = server
    try:
        yield server
    finally:
        EtcdFleetMachine.server = None
        server.stop()


EtcdFleetMachine.TestCase.settings = settings(
    max_examples=ETCD_EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFleetOnEtcd = pytest.mark.usefixtures("etcd_for_stateful")(EtcdFleetMachine.TestCase)
