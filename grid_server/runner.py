"""Runs the (pure, synchronous) controller inside the server without blocking requests.

Source: the specification's "CLI workflow" (periodic pass plus coalesced prompt passes on
registration, heartbeat, acknowledgement and demand events) and "Local wire contract"
(command delivery is durably marked before the heartbeat response leaves).

Every controller call runs in a worker thread under one lock, so a CPU-bound tick never
stalls the event loop that serves inference. Request features are queued in a bounded deque
(append never blocks) and folded into the controller at the start of the next locked call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import msgspec

from grid_core import routing
from grid_core.demand.features import RequestFeatures
from grid_core.errors import UnavailableError
from grid_core.hosts import LEASE_TTL_S, build_host_snapshots
from grid_core.planner.reclaim import surplus_release_s
from grid_core.profile import ModelProfile
from grid_core.profile_fit import excluded_everywhere, oversized
from grid_core.snapshot import HostSnapshot
from grid_core.wire import Acknowledgement, Command, Mode

if TYPE_CHECKING:
    from grid_core.controller import Controller, TickResult
    from grid_server.registry import Registry
    from grid_server.router import RouterState

log = logging.getLogger("grid.server.controller")

REGISTRATION_GRACE_S = LEASE_TTL_S
"""Seconds after the server starts during which no model is called unplaceable: the registry
lives in memory, so after a restart every host registers again, and a host that is up does
so within one lease (its heartbeats come far more often). Until then a model whose only
capable hosts have not re-registered yet is an ordinary cold start (``model_not_ready``),
not an operator's problem (``model_unplaceable``, which ``grid chat`` gives up on)."""
MAX_REGISTRATION_GRACE_S = 3600.0
"""Longest registration grace an operator may set (s): an hour covers a fleet of machines
waking up one by one; longer would only hide a profile no host can ever run."""
TICK_INTERVAL_S = 5.0
"""Periodic pass: often enough that a lost event is repaired within seconds."""
PROMPT_TICK_MIN_GAP_S = 0.25
"""Coalescing window: bursts of heartbeats and requests share one prompt pass."""
DEMAND_POKE_MIN_GAP_S = 1.0
"""Request traffic asks for at most one prompt pass per second: demand moves in buckets of
many seconds, and a pass per request would steal CPU from serving."""
MAX_PENDING_FEATURES = 8192
"""Queued request features between passes; beyond this the oldest are dropped (best effort)."""

T = TypeVar("T")


class NotLeaderError(UnavailableError):
    """This server follows another on a replicated store; operator changes go to the leader
    (HTTP 503; the message names the leader's controller id, term and URL)."""


class Delivery(msgspec.Struct, frozen=True):
    """What a command-bearing heartbeat returns (mode, authority TTL, commands)."""

    mode: Mode
    lease_ttl_s: float
    commands: tuple[Command, ...]


class ControllerRunner:
    """Owns the controller instance, its lock and the background pass loop.

    Attributes:
        profiles: model id → profile mirror (read lock-free by the proxy).
        profile_ids: the mirror's keys.
        vocabulary: configured workload names (for ``model: auto``).
        last_error: the last failed pass, shown in status.
    """

    def __init__(
        self,
        controller: Controller,
        registry: Registry,
        router: RouterState,
        *,
        clock: Callable[[], float] = time.time,
        interval_s: float = TICK_INTERVAL_S,
        registration_grace_s: float = REGISTRATION_GRACE_S,
    ) -> None:
        self.ctl = controller
        self.registry = registry
        self.router = router
        self.clock = clock
        self.interval_s = interval_s
        self.registering_until = clock() + registration_grace_s
        """Second (on ``clock``) the registration grace ends (:data:`REGISTRATION_GRACE_S`)."""
        self._lock = threading.Lock()
        self._features: deque[RequestFeatures] = deque(maxlen=MAX_PENDING_FEATURES)
        # Registry inputs and acknowledgements, applied in arrival order under the lock.
        # Queuing them lets a request_commands=false heartbeat return without the lock.
        self._inputs: deque[Callable[[], object]] = deque()
        self._wake: anyio.Event | None = None
        self.dropped_features = 0
        self._last_demand_poke = 0.0
        self.ticks = 0
        self.last_error: str | None = None
        self.last_tick_s: float | None = None
        self.profiles: dict[str, ModelProfile] = {}
        self.forwarder: Any = None
        """A :class:`grid_server.forwarding.DemandForwarder` on a replicated store (else
        ``None``): where request features go while this server follows."""
        self.profile_ids: frozenset[str] = frozenset()
        self.vocabulary: tuple[str, ...] = ()
        self.on_request: Callable[[RequestFeatures], None] | None = None
        """Called with every request's features (metrics); must be cheap and never raise."""
        self.on_tick: Callable[[float], None] | None = None
        """Called with each pass's duration in seconds (metrics)."""
        self.follower: str | None = None
        """Set while this server follows another on a replicated store (the refusal quoting
        the leader): no passes, no commands, receipts ignored, operator changes refused."""
        self._refresh_profiles()

    # --- helpers ------------------------------------------------------------------------
    def _refresh_profiles(self) -> None:
        profiles = getattr(self.ctl, "profiles", None)
        if isinstance(profiles, dict):
            self.profiles = {k: v for k, v in profiles.items() if isinstance(v, ModelProfile)}
        self.profile_ids = frozenset(self.profiles)
        self.vocabulary = tuple(
            sorted({w for p in self.profiles.values() for w in p.workload_scores})
        )

    def hosts(self, now: float) -> tuple[HostSnapshot, ...]:
        """Current host snapshots (call on the event loop: the registry lives there)."""
        return build_host_snapshots(self.registry.live(now), now, self.router.measurements)

    def _drain_features(self) -> None:
        while self._inputs:
            event = self._inputs.popleft()
            try:
                event()
            except Exception:  # keep the pass alive; status shows the error
                log.exception("controller refused an input event")
        while self._features:
            f = self._features.popleft()
            try:
                self.ctl.observe_request(f)
            except Exception:  # one bad feature must not stop planning
                log.exception("controller refused a request observation")

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in a worker thread under the controller lock."""

        def locked() -> T:
            with self._lock:
                self._drain_features()
                return fn()

        return await anyio.to_thread.run_sync(locked)

    async def swap(self, controller: Controller, *, follower: str | None) -> None:
        """Replace the controller (elected: a fresh one restored from the newest state;
        following: a read-only view) under the lock, and set the follower refusal."""

        def replace() -> None:
            self._inputs.clear()  # inputs queued for the previous instance
            self.ctl = controller
            self.follower = follower

        await anyio.to_thread.run_sync(lambda: self._locked(replace))
        self._refresh_profiles()
        self.poke()

    def _locked(self, fn: Callable[[], T]) -> T:
        with self._lock:
            return fn()

    def _refuse_if_follower(self) -> None:
        """Raises NotLeaderError (503) quoting the leader while this server follows."""
        if self.follower is not None:
            raise NotLeaderError(self.follower)

    # --- events ---------------------------------------------------------------------------
    def observe(self, features: RequestFeatures) -> None:
        """Queue one request's features (never blocks, never raises into the request).

        While this server follows, the features go to :attr:`forwarder` for the leader: a
        follower's controller is a read-only view whose history is discarded.
        """
        if self.on_request is not None:
            self.on_request(features)
        if self.follower is not None and self.forwarder is not None:
            self.forwarder.add(features)
            return
        self.observe_here(features)

    def observe_here(self, features: RequestFeatures) -> None:
        """Queue one observation for this server's own controller (also one forwarded here
        by a follower, or kept while this server followed)."""
        if len(self._features) == self._features.maxlen:
            self.dropped_features += 1
        self._features.append(features)
        mono = time.monotonic()
        if mono - self._last_demand_poke >= DEMAND_POKE_MIN_GAP_S:
            self._last_demand_poke = mono
            self.poke()

    def retry_after_s(self, model_id: str | None, now: float) -> int:
        """``Retry-After`` (whole seconds) for a configured model with no ready engine.

        The estimate is the learned load+warm time of the host that will serve the model
        first: a replica already loading or warming counts with the time it has already
        spent; otherwise the hosts the last plan assigned it to or staged an eviction for
        (plus :data:`grid_core.routing.RECLAIM_ALLOWANCE_S` for the drain); otherwise the fastest
        eligible startup path the last forecast projected. Bounds:
        :func:`grid_core.routing.cold_retry_after_s`. Reads the controller's last results
        without the lock (a torn read only falls back to the default).
        """
        if model_id is None:
            return routing.cold_retry_after_s(())
        try:
            return routing.cold_retry_after_s(self._startup_estimates(model_id, now))
        except Exception:  # never fail a 503 over an estimate
            log.debug("retry-after estimate failed", exc_info=True)
            return routing.cold_retry_after_s(())

    def portfolio_choice(self, workload: str | None) -> str | None:
        """The model the allocator's last portfolio decision maps ``workload`` to, or ``None``.

        The router serves an ``auto`` request with this model when it is ready, so the
        allocator — not the router's configured-score ranking — decides which candidate
        serves a workload once measured evidence has reordered them (specification, "Single-
        machine scenario lab and logical fleet test": the allocator, not the router, chooses
        the measured portfolio winner). Reads the controller's last results without the lock
        (a torn read only means ``None``, and the router falls back to configured scores).
        """
        if workload is None:
            return None
        report = getattr(getattr(self.ctl, "last", None), "portfolio", None)
        mapping = getattr(report, "mapping", None)
        chosen = mapping.get(workload) if isinstance(mapping, dict) else None
        return chosen if isinstance(chosen, str) else None

    def unplaceable(self, model_id: str | None) -> str | None:
        """Why ``model_id`` can be placed on no host at all, or ``None``.

        Such a model will not start by waiting, until an operator changes the profile or the
        fleet: the last plan found no eligible host for it (its ``no_eligible_host``
        shortfall message), no live host offers what its profile requires (runtime, tags,
        backends, GPUs: :func:`grid_core.profile_fit.excluded_everywhere`, known before any
        pass has planned its demand), or one replica needs more memory than any host that
        can run it has even when empty (:func:`grid_core.profile_fit.oversized`).
        A grid with no live host at all is still waiting for its hosts to register, so it
        answers ``None`` (an ordinary cold start); so may a server started moments ago
        (:meth:`registration_left_s`, for the caller to weigh). Reads the last plan without
        the lock (a torn read only means ``None``); call on the event loop, where the
        registry lives.
        """
        now = self.clock()
        profile = self.profiles.get(model_id) if model_id is not None else None
        if profile is None or not self.registry.live(now):
            return None
        plan = getattr(getattr(self.ctl, "last", None), "plan", None)
        for u in plan.unmet if plan is not None else ():
            if u.model_id == model_id and u.code == "no_eligible_host":
                return str(u.message).removeprefix(f"model '{model_id}': ")  # callers name it
        hosts = self.hosts(now)
        return excluded_everywhere(profile, hosts) or oversized(profile, hosts)

    def registration_left_s(self) -> float:
        """Seconds of the registration grace left (0 once it has passed): until then a model
        no registered host can run may still gain one, as hosts register again after a
        (re)start (:data:`REGISTRATION_GRACE_S`)."""
        return max(0.0, self.registering_until - self.clock())

    def _startup_estimates(self, model_id: str, now: float) -> list[float]:
        profile = self.profiles.get(model_id)
        if profile is None:
            return []
        timings = getattr(self.ctl, "timings", None)
        plan = self.ctl.last.plan
        out: list[float] = []
        starting = False
        planned = set(plan.hosts_of(model_id)) if plan is not None else set()
        reclaiming = (
            {e.host_id for e in plan.evictions if e.beneficiary == model_id}
            if plan is not None
            else set()
        )
        planned |= reclaiming
        for host in self.hosts(now):
            res = host.residency(model_id)
            cached = model_id in host.cached
            if res is not None and res.state in ("loading", "warming"):
                starting = True
            elif host.host_id not in planned or (res is not None and res.state == "ready"):
                continue
            warm, load = profile.warm_estimate_s, profile.load_estimate_s
            if timings is not None:
                w, ld, fetch = timings.performance(host.host_id, profile, now)
                warm = w if w is not None else warm
                phase = fetch if profile.artifact_source is not None else ld
                load = phase if phase is not None else load
            total = warm if cached else warm + load
            spent = now - res.loaded_at if res is not None and res.loaded_at else 0.0
            if host.host_id in reclaiming:
                total += routing.RECLAIM_ALLOWANCE_S  # the victim drains and unloads first
            out.append(total - max(0.0, spent))
        if not out and not starting:
            fc = self.ctl.last.forecasts.get(model_id)
            horizon = (
                fc.projection_horizon_s
                if fc is not None
                else profile.load_estimate_s + profile.warm_estimate_s
            )
            # No host planned yet. When no host is free, the wait until some host's work may
            # be taken for it (a burst's surplus leaving the live window, minimum residency),
            # then the pass that stages the reclaim, the drain, and the fastest startup path.
            # This request is itself direct demand, even before a forecast has seen it.
            release = surplus_release_s(
                profile, self.profiles, self.ctl.last.forecasts, self.hosts(now), now
            )
            if release is not None and release > 0:
                out.append(release + self.interval_s + routing.RECLAIM_ALLOWANCE_S + horizon)
            elif fc is not None and fc.desired_replicas > 0:
                out.append(horizon)
        return out

    def poke(self) -> None:
        """Ask for a prompt pass (coalesced)."""
        if self._wake is not None:
            self._wake.set()

    def input_changed(self, now: float, safety_changed: bool = False) -> None:
        """Registration/heartbeat changed the inputs: queue a dirty-revision bump, poke.

        Never takes the lock, so an early lease heartbeat returns at once.
        """
        self._inputs.append(lambda: self.ctl.note_input(now, safety_changed=safety_changed))
        self.poke()

    # --- operator actions -------------------------------------------------------------------
    async def put_profile(self, profile: ModelProfile, expected_version: str | None = None) -> None:
        """Create or replace a profile (validated by the caller).

        ``expected_version`` is checked under the controller lock, atomically with the write
        (see :meth:`grid_core.controller.Controller.put_profile`).

        Raises:
            NotLeaderError: this server follows another (the message names the leader).
        """
        self._refuse_if_follower()
        now = self.clock()
        if expected_version is None:
            await self.call(lambda: self.ctl.put_profile(profile, now))
        else:
            await self.call(
                lambda: self.ctl.put_profile(profile, now, expected_version=expected_version)
            )
        self._refresh_profiles()
        self.poke()

    async def remove_profile(self, model_id: str) -> None:
        """Retire a profile (the controller converges it to zero); NotLeaderError on a follower."""
        self._refuse_if_follower()
        now = self.clock()
        await self.call(lambda: self.ctl.remove_profile(model_id, now))
        self._refresh_profiles()
        self.poke()

    async def set_mode(self, mode: str) -> None:
        """Select observe, recommend or automatic; NotLeaderError on a follower."""
        self._refuse_if_follower()
        now = self.clock()
        await self.call(lambda: self.ctl.set_mode(mode, now))
        self.poke()

    async def tick(self) -> TickResult:
        """Run one pass now and return the controller's tick result (NotLeaderError on a
        follower: only the leader plans)."""
        self._refuse_if_follower()
        now = self.clock()
        hosts = self.hosts(now)
        t0 = time.perf_counter()
        try:
            result = await self.call(lambda: self.ctl.tick(now, hosts))
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            raise
        self.last_tick_s = time.perf_counter() - t0
        if self.on_tick is not None:
            self.on_tick(self.last_tick_s)
        note = getattr(self.ctl, "note_tick_duration", None)
        if note is not None:
            elapsed = self.last_tick_s
            self._inputs.append(lambda: note(elapsed))
        self.ticks += 1
        self.last_error = None
        self._log_issued(result)
        return result

    def _log_issued(self, result: TickResult) -> None:
        """One log line per action this pass issued: what, where, why (status has the rest)."""
        book = getattr(self.ctl, "book", None)
        for action_id in getattr(result, "issued", ()):
            a = book.get(action_id) if book is not None else None
            if a is None:
                continue
            why = f" for {a.beneficiary}" if a.beneficiary else ""
            log.info(
                "issued %s %s on %s: %s%s (priority %s, action %s)",
                a.kind,
                a.model_id,
                a.host_id,
                a.reason,
                why,
                a.priority,
                action_id,
            )

    async def status(self, detail: bool) -> dict[str, Any]:
        """The controller's status as plain data."""
        now = self.clock()
        raw = await self.call(lambda: self.ctl.status(now, detail))
        return msgspec.to_builtins(raw) if not isinstance(raw, dict) else raw

    def acknowledge(self, host_id: str, acks: list[Acknowledgement]) -> None:
        """Queue a heartbeat's acknowledgements (applied before the next controller call)."""
        if not acks or self.follower is not None:
            return  # a follower's controller is a read-only view: the leader takes receipts
        now = self.clock()
        batch = list(acks)
        for ack in batch:
            if ack.status != "succeeded":
                log.warning(
                    "%s reported action %s %s: %s", host_id, ack.action_id, ack.status, ack.message
                )
        self._inputs.append(lambda: self.ctl.acknowledge(host_id, batch, now))
        self.poke()

    async def deliver(self, host_id: str) -> Delivery:
        """Commands for a command-bearing heartbeat, durably marked delivered.

        Runs a pass first when the poll's causal revision has not been processed yet, so
        the answer reflects the heartbeat that asked.
        """
        if self.follower is not None:
            return Delivery(self.mode(), 0.0, ())  # only the leader commands
        now = self.clock()
        hosts = self.hosts(now)

        def reread() -> tuple[float, tuple[HostSnapshot, ...]]:
            # Called from the worker thread after the delivery marker is durable: the
            # registry lives on the event loop, so the fresh snapshot is taken there.
            def on_loop() -> tuple[float, tuple[HostSnapshot, ...]]:
                t = self.clock()
                return t, self.hosts(t)

            return anyio.from_thread.run_sync(on_loop)

        def work() -> Delivery:
            ctl = self.ctl
            poll_revision = ctl.revisions.dirty
            if ctl.revisions.processed < poll_revision:
                ctl.tick(now, hosts)
                self.ticks += 1
            d = ctl.deliver(host_id, now, hosts, poll_revision, fresh_hosts=reread)
            delivered: Mode | None = getattr(d, "mode", None)
            current: Mode = getattr(ctl, "mode", "recommend")
            mode = delivered or current
            return Delivery(
                mode,
                float(getattr(d, "lease_ttl_s", 0.0) or 0.0),
                tuple(getattr(d, "commands", ()) or ()),
            )

        return await self.call(work)

    def mode(self) -> Mode:
        """Current mode (lock-free read of a plain attribute)."""
        mode: Mode = getattr(self.ctl, "mode", "recommend")
        return mode

    # --- background loop ---------------------------------------------------------------------
    async def run(self) -> None:
        """Periodic passes plus coalesced prompt passes, until cancelled."""
        self._wake = anyio.Event()
        while True:
            with anyio.move_on_after(self.interval_s):
                await self._wake.wait()
            self._wake = anyio.Event()
            try:
                if self.registry.expire(self.clock()):
                    # Expired records are a membership change: destructive safety moved.
                    self.input_changed(self.clock(), safety_changed=True)
                if self.follower is None:
                    await self.tick()
            except Exception as exc:  # a failed pass is visible in status, never fatal
                log.warning("controller pass failed: %s", type(exc).__name__)
                self.last_error = f"{type(exc).__name__}: {exc}"
            await anyio.sleep(PROMPT_TICK_MIN_GAP_S)
