"""The shared simulated fleet for unit tests: real controller, real planner, simulated nodes.

The nodes here follow the managed node's wire rules (host match, executable, term fencing,
lease TTL, dependencies, receipt de-duplication by action id) but deliberately do NOT
defend against a bad controller: a warm starts even if memory is short, a drain starts even
on the last replica. Each such harm is recorded as a violation instead, so tests can prove
the controller never asks for it.

Build one with :meth:`SimFleet.uniform` (``n`` equal hosts) or from ``{host id: capacity
MB}``; the stateful test draws that mapping from :func:`fleet_strategies.sim_fleets`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grid_core.controller import Controller
from grid_core.errors import ConflictError
from grid_core.planner import plan
from grid_core.planner.types import Assignment, Plan, PlanInputs
from grid_core.profile import ModelProfile, revision_matches
from grid_core.reconcile.authority import CONTROLLER_LEASE_S
from grid_core.reconcile.state import ControllerState, decode_state
from grid_core.snapshot import HostSnapshot, ResidencySnapshot
from grid_core.store import MemoryStore
from grid_core.testing import plugins_with
from grid_core.wire import Acknowledgement, Command

PLANNER_PLUGINS = ("grid_scoring", "grid_victims", "grid_forecast_ewma")


class DurableMemoryStore(MemoryStore):
    """An in-memory store that claims durability, standing in for the file store in pure
    unit tests (the file store itself is tested against real files).

    Its lease behaves like the file store's: a live holder's unexpired lease cannot be
    taken over; a holder marked dead (its process is gone) can be replaced at once.
    """

    durable = True

    def __init__(self) -> None:
        super().__init__()
        self.dead: set[str] = set()

    def acquire_lease(self, controller_id: str, now: float, ttl_s: float) -> tuple[int, float]:
        holder = self._holder
        if (
            holder is not None
            and holder != controller_id
            and holder not in self.dead
            and self._expires > now
        ):
            msg = f"controller '{holder}' holds the lease for {self._expires - now:.0f} s"
            raise ConflictError(msg)
        return super().acquire_lease(controller_id, now, ttl_s)


@dataclass
class SimResidency:
    model_id: str
    memory_mb: int
    state: str
    active: int = 0
    loaded_at: float = 0.0
    sha: str | None = None
    """Artifact revision the warm proved (the command's digest)."""


@dataclass
class SimNode:
    host_id: str
    capacity_mb: int
    reserved_mb: int = 0
    lifecycle: str = "accepting"
    up: bool = True
    residencies: dict[str, SimResidency] = field(default_factory=dict)
    cached: set[str] = field(default_factory=set)
    cached_sha: dict[str, str | None] = field(default_factory=dict)
    """Digest of each cached model's weights (absent: unknown)."""
    highest_term: int = 0
    term_owner: str = ""
    receipts: dict[str, str] = field(default_factory=dict)
    started: dict[str, Command] = field(default_factory=dict)
    queue: list[Command] = field(default_factory=list)
    outbox: list[Acknowledgement] = field(default_factory=list)
    last_report: HostSnapshot | None = None
    last_report_at: float | None = None
    drained_at: dict[str, float] = field(default_factory=dict)
    """When each model's last drain finished here (a forced unload must come a deadline later)."""

    def held_mb(self) -> int:
        return sum(r.memory_mb for r in self.residencies.values() if r.state != "cached")

    def snapshot(self, now: float) -> HostSnapshot:
        res = tuple(
            ResidencySnapshot(
                model_id=r.model_id,
                memory_mb=r.memory_mb,
                state=r.state,
                active_requests=r.active,
                loaded_at=r.loaded_at,
                routable=r.state == "ready",
                artifact_sha256=r.sha,
            )
            for r in sorted(self.residencies.values(), key=lambda r: r.model_id)
        )
        return HostSnapshot(
            host_id=self.host_id,
            capacity_mb=self.capacity_mb,
            reserved_mb=self.reserved_mb,
            state=self.lifecycle,  # type: ignore
            heartbeat_age_s=0.0,
            runtimes=("llama.cpp",),
            backends=("metal",),
            failure_domain=f"fd-{self.host_id[-1]}",
            residencies=res,
            cached={m: self.cached_sha.get(m) for m in sorted(self.cached)},
            actuator_capabilities=("load", "warm", "drain", "unload"),
        )


class SimFleet:
    """Nodes, a clock and the controller under test (restartable on the same store)."""

    def __init__(
        self,
        hosts: dict[str, int],
        *,
        now: float = 1_000_000.0,
        plan_fn: Callable[..., object] | None = None,
        store_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.now = now
        self.store_factory = store_factory
        """Each controller instance gets its own store from this (several servers on one
        replicated store, e.g. etcd, where a write needs the lease); ``None`` shares one
        :class:`DurableMemoryStore` between every instance (one state file)."""
        self.nodes = {h: SimNode(host_id=h, capacity_mb=mb) for h, mb in hosts.items()}
        self.store = DurableMemoryStore()
        self.plugins = plugins_with(builtins=PLANNER_PLUGINS)
        self.override: dict[str, list[str]] | None = None
        self.plan_fn = plan_fn or self._plan
        self.ctl = self._new_controller()
        self.zombies: list[Controller] = []
        self.violations: list[str] = []
        self.profiles: dict[str, ModelProfile] = {}
        self.retired: set[str] = set()
        self.terms_sent: list[int] = []
        self.unobservable: list[tuple[str, str, str]] = []
        """(drained host, replacement host, model) of drains decided on a replacement's valid
        report that was lost after that report and before the drain began (its engine died or
        its host stopped accepting, which no controller can see yet); counted, not
        violations."""
        self.refused: list[tuple[str, str, str, str]] = []
        """(host, kind, model, reason) of every command a node refused when it started."""
        self.forced: list[tuple[str, str, int]] = []
        """(host, model, requests cut) of every unload the controller forced."""

    @classmethod
    def uniform(cls, count: int, capacity_mb: int, **kw: object) -> SimFleet:
        """``count`` equal hosts ``h1`` … ``hN`` of ``capacity_mb`` each (other args as
        for the constructor)."""
        return cls({f"h{i}": capacity_mb for i in range(1, count + 1)}, **kw)  # type: ignore[arg-type]

    def _new_controller(self) -> Controller:
        if self.store_factory is None:
            return Controller(
                plugins=self.plugins, store=self.store, plan_fn=self.plan_fn
            ).restore()  # type: ignore[arg-type]
        store = self.store_factory()
        ctl = Controller(plugins=self.plugins, store=store, plan_fn=self.plan_fn)
        # Like a Grid server on a replicated store: the instance is elected first, then
        # restores the newest document and becomes the only writer.
        store.acquire_lease(ctl.authority.controller_id, self.now, CONTROLLER_LEASE_S)
        return ctl.restore()

    def _plan(self, inputs: PlanInputs, plugins: object) -> Plan:
        """The real planner, unless a test forces an arbitrary (even unsafe) placement."""
        if self.override is None:
            return plan(inputs, plugins)
        mem = {p.model_id: p.memory_mb for p in inputs.profiles}
        assigned = tuple(
            Assignment(
                model_id=m,
                host_id=h,
                incumbent=False,
                runtime="llama.cpp",
                memory_mb=mem[m],
                reason="score",
            )
            for m, hosts in sorted(self.override.items())
            if m in mem
            for h in hosts
        )
        return Plan(
            assignments=assigned,
            desired={m: len(h) for m, h in self.override.items() if m in mem},
            digest="override",
        )

    def stale_heartbeat(self, host_id: str) -> None:
        """Receipts arrive, but with the node's previous (older) inventory report."""
        node = self.nodes[host_id]
        if not node.up or node.last_report is None:
            return
        acks, node.outbox = node.outbox, []
        if acks:
            self.ctl.acknowledge(host_id, acks, self.now)
        self.ctl.note_input(self.now, safety_changed=True)

    # --- controller-side inputs ----------------------------------------------------------
    def hosts(self) -> list[HostSnapshot]:
        out = []
        for n in self.nodes.values():
            if n.last_report is None or n.last_report_at is None:
                continue
            age = self.now - n.last_report_at
            out.append(HostSnapshot(**{**_fields(n.last_report), "heartbeat_age_s": age}))
        return out

    def put_profile(self, profile: ModelProfile) -> None:
        self.profiles[profile.model_id] = self.ctl.put_profile(profile, self.now)
        self.retired.discard(profile.model_id)

    def remove_profile(self, model_id: str) -> None:
        self.ctl.remove_profile(model_id, self.now)
        self.profiles.pop(model_id, None)
        self.retired.add(model_id)

    def restart(self, keep_zombie: bool = False) -> None:
        """Start a new controller on the same store; the old one dies or lingers (zombie)."""
        old = self.ctl
        if keep_zombie:
            self.zombies.append(old)
        elif self.store_factory is None:
            self.store.dead.add(old.authority.controller_id)
        if self.store_factory is not None:
            # A successor is elected only once the old instance's lease lapsed (it died, or
            # a partition cut it from the store); a zombie keeps running on its stale view.
            old.document.store.release_lease(old.authority.controller_id)  # type: ignore[attr-defined]
        self.ctl = self._new_controller()

    def restart_if_superseded(self) -> bool:
        """The operator restarts a controller whose durable state another instance wrote."""
        if not self.ctl.authority.superseded:
            return False
        self.restart()
        return True

    def durable_state(self) -> ControllerState | None:
        """What the next restart would restore."""
        data = self.store.data if self.store_factory is None else self.ctl.document.store.load()
        return None if data is None else decode_state(data)

    def tick(self) -> None:
        self.ctl.tick(self.now, self.hosts())

    # --- heartbeats ----------------------------------------------------------------------
    def heartbeat(
        self,
        host_id: str,
        *,
        ack_order: str = "all",
        tick: bool = True,
        dies_in_flight: str | None = None,
    ) -> list[Command]:
        """One command-bearing heartbeat of ``host_id`` (a no-op while it is down).

        ``dies_in_flight``: that model's engine dies after the node sent its report and
        before the response arrives (the commands were decided on a report already old).
        """
        node = self.nodes[host_id]
        if not node.up:
            return []
        node.last_report = node.snapshot(self.now)
        node.last_report_at = self.now
        acks = self._pick_acks(node, ack_order)
        if acks:
            self.ctl.acknowledge(host_id, acks, self.now)
        self.ctl.note_input(self.now, safety_changed=True)
        poll = self.ctl.revisions.dirty
        hosts = self.hosts()
        if tick and self.ctl.revisions.processed < poll:
            self.ctl.tick(self.now, hosts)
        d = self.ctl.deliver(host_id, self.now, hosts, poll)
        if dies_in_flight is not None:
            self.engine_dies(host_id, dies_in_flight)
        self.receive(node, list(d.commands), d.lease_ttl_s)
        return list(d.commands)

    def zombie_deliver(self, host_id: str) -> None:
        """A superseded controller instance tries to command a node (split brain).

        Like every Grid server, a lingering instance answers only a heartbeat: the node must
        be up, and its current report is registered (and noted as input) before the instance
        ticks if behind and selects commands, with the same final re-read of the registry as
        the server's delivery. A node that is down or cut off receives nothing.
        """
        node = self.nodes[host_id]
        if not node.up:
            return
        for z in self.zombies:
            if z.mode != "automatic":
                continue
            node.last_report = node.snapshot(self.now)
            node.last_report_at = self.now
            for c in (z, self.ctl):
                c.note_input(self.now, safety_changed=True)
            poll = z.revisions.dirty
            hosts = self.hosts()
            if z.revisions.processed < poll:
                z.tick(self.now, hosts)
            d = z.deliver(
                host_id, self.now, hosts, poll, fresh_hosts=lambda: (self.now, self.hosts())
            )
            self.receive(node, list(d.commands), d.lease_ttl_s, trusted=False)

    def zombie_tick(self) -> None:
        """Superseded controller instances keep ticking (and so try to save their state)."""
        for z in self.zombies:
            z.tick(self.now, self.hosts())

    def _pick_acks(self, node: SimNode, order: str) -> list[Acknowledgement]:
        if not node.outbox:
            return []
        acks = list(node.outbox)
        if order == "reverse":
            acks.reverse()
        elif order == "duplicate":
            acks = acks + acks[:1]
        elif order == "partial":
            keep = acks[1:]
            acks = acks[:1]
            node.outbox = keep
            return acks
        node.outbox = []
        return acks

    # --- the node ------------------------------------------------------------------------
    def receive(
        self, node: SimNode, commands: list[Command], ttl_s: float, trusted: bool = True
    ) -> None:
        for c in commands:
            if trusted:
                self.terms_sent.append(c.controller_term)
                self._check_target(node, c)
                if c.kind == "drain":
                    self._check_priority_order(node, c)
            if c.kind == "drain":
                self._check_drain_matches_report(node, c)
            if c.node_id != node.host_id or not c.executable or ttl_s <= 0:
                continue
            if c.controller_term < node.highest_term:
                self.violations.append(
                    f"term {c.controller_term} command reached "
                    f"{node.host_id} after term {node.highest_term}"
                )
            if c.controller_term < node.highest_term or (
                c.controller_term == node.highest_term
                and node.term_owner
                and c.controller_id != node.term_owner
            ):
                if c.action_id not in node.receipts:
                    node.outbox.append(
                        Acknowledgement(
                            action_id=c.action_id, status="rejected", message="lower term"
                        )
                    )
                continue
            node.highest_term, node.term_owner = c.controller_term, c.controller_id
            if (
                c.action_id in node.receipts
                or c.action_id in node.started
                or any(q.action_id == c.action_id for q in node.queue)
            ):
                continue  # a re-delivered command is never executed twice
            node.queue.append(c)
        self._start_next(node)

    def _check_target(self, node: SimNode, c: Command) -> None:
        if node.lifecycle in ("unhealthy", "quarantined"):
            self.violations.append(f"{c.kind} sent to {node.lifecycle} host {node.host_id}")
        if c.kind in ("load", "warm") and node.lifecycle not in ("accepting", "throttled"):
            self.violations.append(f"{c.kind} sent to non-accepting host {node.host_id}")

    def _start_next(self, node: SimNode) -> None:
        """Start queued commands whose dependencies succeeded (one at a time per node)."""
        while node.queue and not node.started:
            c = node.queue[0]
            if any(node.receipts.get(d) not in (None, "succeeded") for d in c.dependencies):
                node.queue.pop(0)
                node.receipts[c.action_id] = "failed"
                node.outbox.append(
                    Acknowledgement(
                        action_id=c.action_id, status="failed", message="dependency failed"
                    )
                )
                continue
            if any(d not in node.receipts for d in c.dependencies):
                return
            node.queue.pop(0)
            refusal = self._admit(node, c)
            if refusal is not None:
                node.receipts[c.action_id] = "rejected"
                node.outbox.append(
                    Acknowledgement(action_id=c.action_id, status="rejected", message=refusal)
                )
                self.refused.append((node.host_id, c.kind, c.model_id, refusal))
                continue
            self._begin(node, c)
            node.started[c.action_id] = c
            node.outbox.append(Acknowledgement(action_id=c.action_id, status="running"))

    @staticmethod
    def _admit(node: SimNode, c: Command) -> str | None:
        """The node's own check when a command starts (as ``grid_node.admission``): a drain
        runs only on a residency that is serving or already draining here. One decided on a
        report that is no longer true (its engine died or failed since) is refused."""
        if c.kind != "drain":
            return None
        r = node.residencies.get(c.model_id)
        if r is None:
            return f"drain of {c.model_id} refused: no {c.model_id} engine runs on this host"
        if r.state not in ("ready", "draining"):
            return f"drain of {c.model_id} refused: its engine is {r.state}"
        return None

    def _check_drain_matches_report(self, node: SimNode, c: Command) -> None:
        """A controller answers a heartbeat whose report it has just registered: a drain of a
        residency that report shows absent or not serving was decided against the facts."""
        report = node.last_report
        r = report.residency(c.model_id) if report is not None else None
        if r is None or r.state not in ("ready", "draining"):
            state = "absent" if r is None else r.state
            self.violations.append(
                f"stale drain of {c.model_id} sent to {node.host_id}: its report showed {state}"
            )

    def _begin(self, node: SimNode, c: Command) -> None:
        """The effect that happens at the start of an action, with its safety checks."""
        r = node.residencies.get(c.model_id)
        if c.kind == "warm":
            if r is not None and r.state not in ("cached", "failed"):
                self.violations.append(f"duplicate warm of {c.model_id} on {node.host_id}")
                return
            extra = 0 if r is not None and r.state == "failed" else c.memory_mb
            if node.held_mb() + extra > node.capacity_mb - node.reserved_mb:
                self.violations.append(f"overcommit by warm of {c.model_id} on {node.host_id}")
            node.residencies[c.model_id] = SimResidency(
                c.model_id, c.memory_mb, "warming", loaded_at=self.now, sha=c.artifact_sha256
            )
        elif c.kind == "drain":
            if r is None or r.state != "ready":
                self.violations.append(f"duplicate drain of {c.model_id} on {node.host_id}")
                return
            self._check_last_replica(node, c)
            r.state = "draining"
        elif c.kind == "unload":
            if r is None or r.state not in ("draining", "failed"):
                self.violations.append(f"duplicate unload of {c.model_id} on {node.host_id}")
                return
            if r.active > 0 and not c.force:
                self.violations.append(
                    f"unload of {c.model_id} on {node.host_id} with {r.active} in flight"
                )
            if c.force:
                # Cutting requests is allowed only as the drain deadline's explicit decision.
                drained = node.drained_at.get(c.model_id)
                deadline = self.ctl.policy.governor.drain_deadline_s
                if drained is None or self.now - drained < deadline:
                    self.violations.append(
                        f"forced unload of {c.model_id} on {node.host_id} before the drain deadline"
                    )
                self.forced.append((node.host_id, c.model_id, r.active))
            del node.residencies[c.model_id]

    def _check_priority_order(self, node: SimNode, c: Command) -> None:
        """A drain never takes served work away for lower-priority work (specification,
        "Safety invariants" 8: scarce slots go to higher-priority service)."""
        victim = self.profiles.get(c.model_id)
        action = self.ctl.book.get(c.action_id)
        if victim is None or action is None:
            return
        if action.eviction:
            b = self.profiles.get(action.beneficiary or "")
            if self._rolled_out_elsewhere(node, victim):
                return  # a finished rollout's old revision: the model keeps its service
            if self._surplus_elsewhere(node, c.model_id):
                return  # a replica beyond what the victim needs: nothing needed is lost
            if (
                b is not None
                and b.priority == victim.priority
                and self._fair_share_kept(node, c.model_id, b)
            ):
                return  # max-min fair within the class, floors before extras
            if b is not None and b.priority <= victim.priority:
                self.violations.append(
                    f"priority inversion: {c.model_id} (priority {victim.priority}) evicted on "
                    f"{node.host_id} for {b.model_id} (priority {b.priority})"
                )
            return
        plan = self.ctl.last.plan
        if plan is None or node.host_id in plan.hosts_of(c.model_id):
            return
        wanted = plan.desired.get(c.model_id, 0)
        placed = len(plan.hosts_of(c.model_id))
        if placed >= wanted:
            return  # surplus: nothing served is lost for anyone
        for a in plan.assignments:
            lower = self.profiles.get(a.model_id)
            if (
                a.host_id == node.host_id
                and not a.incumbent
                and lower is not None
                and lower.priority < victim.priority
            ):
                self.violations.append(
                    f"priority inversion: {c.model_id} (priority {victim.priority}, still "
                    f"short) drained on {node.host_id} while {a.model_id} (priority "
                    f"{lower.priority}) is placed there"
                )

    def _rolled_out_elsewhere(self, node: SimNode, profile: ModelProfile) -> bool:
        """Whether ``node``'s replica of ``profile``'s model is an old revision while one of
        the profile's revision is ready on another accepting host: draining it takes no
        service away (the rollout is done; specification, "Managed host actuator")."""
        r = node.residencies.get(profile.model_id)
        if r is None or revision_matches(profile, r.sha):
            return False
        return any(
            n is not node
            and n.lifecycle in ("accepting", "throttled")
            and (cur := n.residencies.get(profile.model_id)) is not None
            and cur.state == "ready"
            and revision_matches(profile, cur.sha)
            for n in self.nodes.values()
        )

    def _surplus_elsewhere(self, node: SimNode, model_id: str) -> bool:
        """Whether ``node``'s replica of ``model_id`` is surplus: the model keeps, ready on
        other accepting hosts, as many replicas as it needs (the plan's desired count, or for
        a replica the plan reclaims as surplus the count its current demand needs, the rest
        being hysteresis), so evicting this one takes no needed service away, whatever the
        beneficiary's priority (scale-down would free it anyway)."""
        plan = self.ctl.last.plan
        if plan is None:
            return False
        needed = plan.desired.get(model_id, 0)
        for extra in plan.surplus:
            if (extra.model_id, extra.host_id, extra.decision) == (
                model_id,
                node.host_id,
                "reclaimed",
            ):
                needed = extra.needed  # the plan's own count: the rest is hysteresis
        serving = self.ready_hosts(model_id, serving_only=True)
        kept = [h for h in plan.hosts_of(model_id) if h != node.host_id and h in serving]
        return len(kept) >= needed

    def ready_hosts(
        self, model_id: str, *, sha: str | None = None, serving_only: bool = False
    ) -> list[str]:
        """Hosts (sorted) where ``model_id`` is really ready now, whatever their reports say:
        only of revision ``sha`` when it is given, only accepting or throttled hosts (whose
        replicas serve) with ``serving_only``."""
        return sorted(
            h
            for h, n in self.nodes.items()
            if (r := n.residencies.get(model_id)) is not None
            and r.state == "ready"
            and (sha is None or r.sha == sha)
            and (not serving_only or n.lifecycle in ("accepting", "throttled"))
        )

    def _ready_elsewhere(self, node: SimNode | None, model_id: str, sha: str | None) -> int:
        """Serving ready replicas of ``model_id`` on hosts other than ``node`` (only those of
        revision ``sha`` when it is given)."""
        skip = node.host_id if node is not None else None
        return sum(1 for h in self.ready_hosts(model_id, sha=sha, serving_only=True) if h != skip)

    def _fair_share_kept(self, node: SimNode, model_id: str, beneficiary: ModelProfile) -> bool:
        """Whether evicting ``node``'s replica of ``model_id`` for an equal-priority
        ``beneficiary`` is max-min fair: the victim keeps at least one ready replica elsewhere
        and still has more than the beneficiary has ready of its profile's revision before
        this eviction (specification, "Global placement loop": within one priority class,
        one replica per model per round), or the eviction raises the beneficiary towards its
        ``min_replicas`` while the victim keeps its own minimum (a floor the operator set
        comes before another model's extra replica)."""
        kept = self._ready_elsewhere(node, model_id, None)
        has = self._ready_elsewhere(None, beneficiary.model_id, beneficiary.artifact_sha256)
        victim = self.profiles.get(model_id)
        floor = victim.min_replicas if victim is not None else 0
        # Floors before extras: the beneficiary is below its operator-set minimum and the
        # victim keeps its own.
        floors_first = has < beneficiary.min_replicas and kept >= floor
        return kept >= 1 and (kept > has or floors_first)

    def engine_dies(self, host_id: str, model_id: str) -> None:
        """A serving engine dies (``kill -9``): the node reports its residency gone."""
        node = self.nodes[host_id]
        r = node.residencies.get(model_id)
        if r is not None and r.state in ("ready", "warming"):
            del node.residencies[model_id]

    def _check_last_replica(self, node: SimNode, c: Command) -> None:
        profile = self.profiles.get(c.model_id)
        if profile is None or profile.min_replicas < 1 or c.reason == "eviction":
            return
        if node.lifecycle not in ("accepting", "throttled"):
            return  # that replica served nothing; draining it removes no availability
        others = [
            n
            for n in self.nodes.values()
            if n is not node
            and n.lifecycle in ("accepting", "throttled")
            and (r := n.residencies.get(c.model_id)) is not None
            and r.state == "ready"
        ]
        if others:
            return
        died = self._replacement_lost_unreported(node, c.model_id)
        if died is not None:
            self.unobservable.append((node.host_id, died, c.model_id))
            return
        self.violations.append(
            f"drain of the last ready replica of required {c.model_id} on {node.host_id}"
        )

    def _replacement_lost_unreported(self, node: SimNode, model_id: str) -> str | None:
        """The host whose replacement of ``model_id`` justified a drain on ``node`` by its
        last report (ready, on an accepting host, young enough for the controller's own lease
        rule) but which has lost it since, unreported: its engine died, or the host stopped
        accepting (paused, drained or quarantined by its owner); ``None`` when no such host
        exists.

        No controller can see what happened after the last report it holds: the drain was
        decided on valid evidence, and the next heartbeat reports the loss (the controller
        then warms a replacement). The soak counts these apart instead of calling the
        controller wrong; a drain with no such evidence is still a violation.
        """
        gov = self.ctl.policy.governor
        for n in self.nodes.values():
            report, at = n.last_report, n.last_report_at
            if n is node or report is None or at is None:
                continue
            if report.state not in ("accepting", "throttled"):
                continue
            if self.now - at >= gov.route_lease_s - gov.lease_margin_s:
                continue
            seen = report.residency(model_id)
            if seen is None or seen.state != "ready":
                continue
            now = n.residencies.get(model_id)
            serving = n.lifecycle in ("accepting", "throttled")
            if now is None or now.state != "ready" or not serving:
                return n.host_id
        return None

    def complete(self, host_id: str, *, fail: bool = False) -> None:
        """The node finishes its running action (success or failure) and queues a receipt."""
        node = self.nodes[host_id]
        if not node.up or not node.started:
            return
        aid, c = next(iter(node.started.items()))
        del node.started[aid]
        r = node.residencies.get(c.model_id)
        if c.kind == "load":
            if not fail:
                node.cached.add(c.model_id)
                node.cached_sha[c.model_id] = c.artifact_sha256
        elif c.kind == "warm" and r is not None and r.state == "warming":
            r.state = "failed" if fail else "ready"
        elif c.kind == "drain" and fail and r is not None and r.state == "draining":
            pass  # a failed drain leaves the process draining; the controller unloads later
        if c.kind == "drain":
            # Its receipt says succeeded either way (the route was fenced; a failed drain only
            # leaves the process draining), and the controller's drain deadline runs from
            # that receipt: so does the check of a later forced unload.
            node.drained_at[c.model_id] = self.now
        status = "failed" if fail and c.kind in ("load", "warm") else "succeeded"
        node.receipts[aid] = status
        node.outbox.append(Acknowledgement(action_id=aid, status=status))  # type: ignore
        self._start_next(node)

    def run_requests(self, host_id: str, model_id: str, delta: int) -> None:
        """Requests start on a ready replica (delta > 0) or finish anywhere (delta < 0)."""
        r = self.nodes[host_id].residencies.get(model_id)
        if r is None:
            return
        if delta > 0 and r.state == "ready":
            r.active += delta
        elif delta < 0:
            r.active = max(0, r.active + delta)

    # --- checks --------------------------------------------------------------------------
    def overcommitted(self) -> list[str]:
        return [
            n.host_id for n in self.nodes.values() if n.held_mb() > n.capacity_mb - n.reserved_mb
        ]

    def converge(self, rounds: int = 30, step_s: float = 10.0) -> None:
        """Heartbeat every up host and finish every started action, repeatedly."""
        for _ in range(rounds):
            self.now += step_s
            for h in sorted(self.nodes):
                self.heartbeat(h)
            for h in sorted(self.nodes):
                while self.nodes[h].started:
                    self.complete(h)


def _fields(s: HostSnapshot) -> dict[str, object]:
    return {f: getattr(s, f) for f in s.__struct_fields__}
