"""The four controls a scenario can run on the identical fleet, users and arrivals.

* ``smart`` — the production :class:`~grid_core.controller.Controller` in automatic mode with
  every installed plugin (forecaster, scoring, victims, the ``grid_portfolio`` search, and
  whatever sequence learning or caching is installed).
* ``reactive`` — the same controller with the predictive plugins switched off by entry-point
  name (no trend, so no lookahead projection; no joint portfolio search or exploration: each
  admitted workload gets its best usable model).
* ``greedy`` — every minute, the workload seen in the previous minute is mapped to its
  highest-suitability feasible model and handed to the ordinary planner; the plan is applied
  at once (no make-before-break, no cooldown: the node's own fences still apply).
* ``static`` — the declared user mix's average demand is planned once; that host/model map
  is kept and restored, never rescheduled around a failure.

The controls never see future arrivals. Orders go to :class:`~grid_core.scenario.fleet.SimFleet`
which applies the same node fences to all four.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from grid_core.controller import Controller
from grid_core.demand import ModelDemand, RequestFeatures
from grid_core.demand.features import WORKLOADS
from grid_core.demand.workloads import project_with, projection_map
from grid_core.planner.hooks import PlannerHooks
from grid_core.planner.types import Plan, PlanInputs, PlannerPolicy
from grid_core.plugins import Plugins
from grid_core.profile import ModelProfile
from grid_core.scenario.config import TICK_S
from grid_core.scenario.fleet import Ack, Order, SimFleet
from grid_core.scenario.scorecard import PREDICTIVE_REASONS
from grid_core.store import StateStore
from grid_core.wire import Acknowledgement

MAX_DELIVERY_ROUNDS = 3
"""Follow-up heartbeats per tick: a load's receipt lets its dependent warm ride the next one."""
BASELINE_HEADROOM = 0.2
"""Greedy and static size replicas with the same 20 % headroom the demand side uses."""
PREDICTIVE_PLUGINS = ("grid_forecast_ewma", "grid_portfolio", "grid_sequence")
"""Entry-point names the reactive control runs without: the trend forecaster (lookahead), the
joint portfolio search, and workflow/co-activation prediction (``grid_sequence``, which also
drives the predictive cache)."""


@dataclass
class StepReport:
    """What a control did in one tick (for the timeline and the report)."""

    orders: list[Order] = field(default_factory=list)
    plan: Plan | None = None
    deferred: int = 0
    hold: str | None = None


class ControllerControl:
    """``smart`` / ``reactive``: the production controller drives the simulated nodes."""

    def __init__(
        self,
        name: str,
        plugins: Plugins,
        store: StateStore,
        profiles: tuple[ModelProfile, ...],
        now: float,
    ) -> None:
        self.name = name
        self.ctl = Controller(
            plugins=plugins, store=store, controller_id=f"scenario-{name}"
        ).restore()
        for p in profiles:
            self.ctl.put_profile(p, now)
        self.ctl.set_mode("automatic", now)

    @property
    def profiles(self) -> dict[str, ModelProfile]:
        """Configured profiles as the controller holds them."""
        return self.ctl.profiles

    def step(self, fleet: SimFleet) -> StepReport:
        """Receipts, one controller tick, then command delivery to every live node."""
        now = fleet.now
        hosts = fleet.snapshots()
        for host_id, node in sorted(fleet.nodes.items()):
            if node.online:
                self._acknowledge(host_id, fleet.take_acks(host_id), now)
        self.ctl.note_input(now, safety_changed=True)
        result = self.ctl.tick(now, hosts)
        report = StepReport(
            plan=result.plan,
            deferred=len(result.reconciliation.deferred),
            hold=result.reconciliation.hold,
        )
        for host_id, node in sorted(fleet.nodes.items()):
            if not node.online:
                continue
            for _ in range(MAX_DELIVERY_ROUNDS):
                hosts = fleet.snapshots()
                delivery = self.ctl.deliver(host_id, now, hosts, self.ctl.revisions.success)
                if not delivery.commands:
                    break
                acks = []
                for cmd in delivery.commands:
                    order = Order(
                        cmd.action_id,
                        cmd.kind,
                        host_id,
                        cmd.model_id,
                        cmd.memory_mb,
                        cmd.runtime,
                        cmd.reason,
                    )
                    report.orders.append(order)
                    acks.append(fleet.apply(order, self.ctl.profiles))
                self._acknowledge(host_id, acks, now)
        return report

    def _acknowledge(self, host_id: str, acks: list[Ack], now: float) -> None:
        if acks:
            self.ctl.acknowledge(
                host_id,
                [
                    Acknowledgement(
                        action_id=a.action_id,
                        status=a.status,
                        message=a.message,
                        artifact_fetched=a.artifact_fetched,
                        observed_at=now,
                    )
                    for a in acks
                ],
                now,
            )

    def observe(self, features: list[RequestFeatures]) -> None:
        """Feed finished requests; the controller keeps unbound ones as workload demand."""
        for f in features:
            self.ctl.observe_request(f)

    def chosen(self) -> dict[str, str]:
        """Workload → model the controller's last portfolio chose."""
        report = self.ctl.last.portfolio
        return dict(report.mapping) if report is not None else {}

    def predicted(self) -> frozenset[str]:
        """Models whose demand in the last tick was inferred only (learned workflows or
        co-activation), for the prefetch scorecard."""
        return frozenset(
            m
            for m, d in self.ctl.last.forecasts.items()
            if not d.direct and PREDICTIVE_REASONS & set(d.reasons)
        )


def _demand(rates: dict[str, float], profiles: dict[str, ModelProfile]) -> dict[str, ModelDemand]:
    """Plain offered-concurrency demand (rate x expected service time) per model."""
    out: dict[str, ModelDemand] = {}
    for mid, rate in sorted(rates.items()):
        p = profiles[mid]
        offered = rate * p.expected_service_time_s
        want = math.ceil(
            offered * (1 + BASELINE_HEADROOM) / (p.replica_concurrency * p.target_utilization)
            - 1e-9
        )
        want = max(p.min_replicas, min(p.max_replicas, max(1, want)))
        out[mid] = ModelDemand(
            model_id=mid,
            desired_replicas=want,
            offered_concurrency=offered,
            request_rate_rps=rate,
            direct=True,
            reasons=("demand",),
        )
    return out


def _orders_for(plan: Plan, fleet: SimFleet, tag: str, keep_others: bool) -> list[Order]:
    """Orders that turn the fleet into ``plan``: load+warm what is missing, unload the rest."""
    wanted = {(a.host_id, a.model_id): a for a in plan.assignments}
    orders: list[Order] = []
    for (host_id, model_id), a in sorted(wanted.items()):
        node = fleet.nodes[host_id]
        if not node.online:
            continue
        if model_id in node.residencies:
            continue
        if any(other != model_id for other in node.residencies):
            # The slot is still held: free it first (below, when allowed); start next tick.
            continue
        if model_id not in node.cached:
            orders.append(Order(f"{tag}:load:{host_id}:{model_id}", "load", host_id, model_id))
        orders.append(
            Order(
                f"{tag}:warm:{host_id}:{model_id}",
                "warm",
                host_id,
                model_id,
                a.memory_mb,
                a.runtime,
            )
        )
    if not keep_others:
        for host_id, node in sorted(fleet.nodes.items()):
            for model_id in sorted(node.residencies):
                if (host_id, model_id) not in wanted and node.online:
                    orders.append(
                        Order(f"{tag}:unload:{host_id}:{model_id}", "unload", host_id, model_id)
                    )
    return list(dict.fromkeys(orders))


class GreedyControl:
    """``greedy``: last minute's visible workload → best feasible model → planner → apply."""

    name = "greedy"

    def __init__(
        self,
        plugins: Plugins,
        profiles: tuple[ModelProfile, ...],
        plan_fn: Callable[[PlanInputs, PlannerHooks], Plan],
        policy: PlannerPolicy | None = None,
    ) -> None:
        self.plugins = plugins
        self.profiles = {p.model_id: p for p in profiles}
        self.plan_fn = plan_fn
        self.policy = policy or PlannerPolicy()
        self._seen: list[RequestFeatures] = []

    def step(self, fleet: SimFleet) -> StepReport:
        """Plan for exactly what was visible last minute and apply it."""
        hosts = fleet.snapshots()
        mapping = projection_map(WORKLOADS, self.profiles.values(), hosts, self.policy)
        rates: dict[str, float] = {}
        for f in self._seen:
            target = project_with(f, mapping).requested_model
            if target in self.profiles:
                rates[target] = rates.get(target, 0.0) + 1.0 / TICK_S
        self._seen = []
        plan = self.plan_fn(
            PlanInputs(
                now=fleet.now,
                profiles=tuple(self.profiles.values()),
                hosts=hosts,
                demand=_demand(rates, self.profiles),
                policy=self.policy,
            ),
            self.plugins.planner_hooks(),
        )
        orders = _orders_for(plan, fleet, f"greedy{fleet.tick}", keep_others=False)
        for o in orders:
            fleet.apply(o, self.profiles)
        for host_id in fleet.nodes:
            fleet.take_acks(host_id)
        return StepReport(orders=orders, plan=plan)

    def observe(self, features: list[RequestFeatures]) -> None:
        """Remember this minute's requests (greedy forgets them after the next plan)."""
        self._seen.extend(features)

    def chosen(self) -> dict[str, str]:
        """Greedy maps by the best feasible model (no portfolio of its own)."""
        return {}

    def predicted(self) -> frozenset[str]:
        """Greedy predicts nothing."""
        return frozenset()


class StaticControl:
    """``static``: the declared population's average mix, planned once and kept."""

    name = "static"

    def __init__(
        self,
        plugins: Plugins,
        profiles: tuple[ModelProfile, ...],
        plan_fn: Callable[[PlanInputs, PlannerHooks], Plan],
        mix_rps: dict[str, float],
        direct_rps: dict[str, float],
        policy: PlannerPolicy | None = None,
    ) -> None:
        self.plugins = plugins
        self.profiles = {p.model_id: p for p in profiles}
        self.plan_fn = plan_fn
        self.policy = policy or PlannerPolicy()
        self.mix_rps = mix_rps
        self.direct_rps = direct_rps
        self.plan: Plan | None = None

    def step(self, fleet: SimFleet) -> StepReport:
        """First tick: plan the average mix once. Later ticks: restore that map only."""
        first = self.plan is None
        if self.plan is None:
            hosts = fleet.snapshots()
            mapping = projection_map(WORKLOADS, self.profiles.values(), hosts, self.policy)
            rates = dict(self.direct_rps)
            for w, rps in self.mix_rps.items():
                if w in mapping:
                    rates[mapping[w]] = rates.get(mapping[w], 0.0) + rps
            self.plan = self.plan_fn(
                PlanInputs(
                    now=fleet.now,
                    profiles=tuple(self.profiles.values()),
                    hosts=hosts,
                    demand=_demand(rates, self.profiles),
                    policy=self.policy,
                ),
                self.plugins.planner_hooks(),
            )
        orders = _orders_for(self.plan, fleet, f"static{fleet.tick}", keep_others=True)
        for o in orders:
            fleet.apply(o, self.profiles)
        for host_id in fleet.nodes:
            fleet.take_acks(host_id)
        return StepReport(orders=orders, plan=self.plan if first else None)

    def observe(self, features: list[RequestFeatures]) -> None:
        """Static control ignores what happens."""
        del features

    def chosen(self) -> dict[str, str]:
        """Static maps by the best feasible model (no portfolio of its own)."""
        return {}

    def predicted(self) -> frozenset[str]:
        """Static predicts nothing."""
        return frozenset()
