"""The controller: one tick turns demand and host snapshots into a plan and safe commands.

Pure and synchronous: no sockets, threads or clock reads; every method takes ``now``
(wall-clock Unix seconds) and the caller serialises access (one lock in the server).
Specification: "Reconciliation and modes", "Safety invariants" 3–9, "Local wire contract"
(generations, controller term and lease, dirty/safety revisions, destructive revalidation)
and the restart rules at the end of "HTTP control surface".

Lifecycle in the server::

    ctl = Controller(plugins=plugins, store=FileStateStore(path))   # restores durable state
    ctl.put_profile(profile, now)            # PUT /allocator/models/{id}
    ctl.remove_profile(model_id, now)        # DELETE /allocator/models/{id} (tombstone)
    ctl.set_mode("automatic", now)           # PUT /allocator/mode
    ctl.observe_request(features)            # every finished request (bounded features)
    ctl.note_input(now, safety_changed=...)  # registration/heartbeat changed → dirty revision
    result = ctl.tick(now, hosts)            # periodic + coalesced prompt ticks
    d = ctl.deliver(host_id, now, hosts, poll_revision)  # heartbeat response: selects,
                                             # durably marks, revalidates destructive work
    ctl.acknowledge(host_id, acks, now)      # acknowledgements in heartbeats (also learns
                                             # warm/load/fetch durations)
    ctl.record_evaluation(m, w, sha, score, now)  # POST /allocator/evaluations
    ctl.status(now, detail=True)             # GET /allocator/status (msgspec Struct)
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence

import msgspec

from grid_core.demand import DemandTracker, ModelDemand, RequestFeatures
from grid_core.demand.workloads import UNBOUND, project_with, projection_map
from grid_core.errors import ConflictError, GridError, NotFoundError, StateError, ValidationError
from grid_core.planner.hooks import PlannerHooks
from grid_core.planner.types import Plan, PlanInputs
from grid_core.plugins import Plugins
from grid_core.profile import ModelProfile, validate_profile
from grid_core.reconcile.actions import Action, ActionBook
from grid_core.reconcile.control import (
    CONTROLLER_LEASE_S,
    LEASE_RENEW_FRACTION,
    ControllerPolicy,
    Delivery,
    TickResult,
    build_actions,
    clear_proven_blocks,
    penalise_failures,
    with_in_flight,
)
from grid_core.reconcile.delivery import destructive_problem, select
from grid_core.reconcile.governor import admit, service_key
from grid_core.reconcile.quality import QualityBook, QualityView, check_evaluation
from grid_core.reconcile.reconciler import Deferred, ReconcileInputs, Withdrawal, reconcile
from grid_core.reconcile.state import decode_state, encode_state, restore_into, snapshot_of
from grid_core.reconcile.status import (
    ControllerStatus,
    ReconcileReport,
    controller_status,
)
from grid_core.reconcile.timings import TimingBook
from grid_core.reconcile.view import fresh
from grid_core.snapshot import HostSnapshot
from grid_core.store import StateConflictError, StateStore, state_digest
from grid_core.wire import Acknowledgement, Command, Mode

__all__ = ["Controller", "ControllerPolicy", "Delivery", "TickResult"]

MODES: tuple[Mode, ...] = ("observe", "recommend", "automatic")
SUPERSEDED = "lost: state was written by another controller"
"""Authority shown in status once a conditional save found newer state from another writer."""
PlanFn = Callable[[PlanInputs, PlannerHooks], Plan]


def _default_plan_fn() -> PlanFn:
    from grid_core import planner  # late: the planner imports demand and profile modules

    return planner.plan


class Controller:
    """Owns desired state, the action book, modes, generations and mutation authority.

    Args:
        plugins: the plugin facade (forecaster, score terms, victim selection).
        store: durable state store; restored here. A corrupt document is quarantined and the
            controller starts clean in recommend mode with a visible warning.
        policy: controller, planner and governor tunables.
        plan_fn: the planner (defaults to :func:`grid_core.planner.plan`; tests inject one).
        controller_id: identity stamped on commands (random when omitted).

    Attributes:
        mode: current mode (plain attribute, readable without the server lock).
        profiles: configured profiles by model id.
        dirty_revision: advances on every input.
        safety_revision: advances on changes that matter to destructive safety.
        processed_revision / success_revision: dirty revision the last (successful) tick
            started from.
    """

    def __init__(
        self,
        *,
        plugins: Plugins,
        store: StateStore,
        policy: ControllerPolicy | None = None,
        plan_fn: PlanFn | None = None,
        controller_id: str | None = None,
    ) -> None:
        self.plugins = plugins
        self.store = store
        self.policy = policy or ControllerPolicy()
        self._plan_fn = plan_fn
        self.controller_id = controller_id or secrets.token_hex(8)
        self.mode: Mode = "recommend"
        self.profiles: dict[str, ModelProfile] = {}
        self.tombstones: dict[str, float] = {}
        self.book = ActionBook()
        self.blocks: dict[str, list[str]] = {}
        self.demand = DemandTracker(self.policy.forecast)
        self.quality = QualityBook()
        self.timings = TimingBook()
        self.epoch = secrets.token_hex(8)
        self.sequence = 0
        self.generation = ""
        self.dirty_revision = 0
        self.safety_revision = 0
        self.processed_revision = -1
        self.success_revision = -1
        self.tick_safety_revision = -1
        self.term = 0
        self.lease_expires_at = 0.0
        self.authority = "none"
        self.state_warning: str | None = None
        self.automatic_refusal: str | None = None
        self.warnings: list[str] = []
        self.last_plan: Plan | None = None
        self.last_report: ReconcileReport | None = None
        self.last_forecasts: dict[str, ModelDemand] = {}
        self.last_hosts: dict[str, HostSnapshot] = {}
        self._projection: dict[str, str] = {}
        self._portfolio_plugin = plugins.has_impl("grid_search_portfolio")
        self.last_tick_at: float | None = None
        self.last_tick_duration_ms: float | None = None
        self._order = 0
        self._restored = False
        self._grace_anchor: float | None = None
        self._fresh_hosts: frozenset[str] = frozenset()
        self._hiccup: tuple[float, frozenset[str]] | None = None
        # Digest of the durable bytes this instance last loaded or wrote: every save is
        # conditional on it, so a stale instance can never overwrite a newer writer's state.
        self._state_digest: str | None = None
        self.superseded = False
        if not store.durable:
            self.automatic_refusal = (
                "the controller has no durable state path; configure "
                "one (GRID_HOME/state) before selecting automatic mode"
            )
        self._restore()

    # --- durable state ------------------------------------------------------------------
    def _restore(self) -> None:
        try:
            raw = self.store.load()
            self._state_digest = state_digest(raw)
            state = decode_state(raw) if raw is not None else None
        except StateError as exc:
            if self._quarantine(str(exc)):
                self._state_digest = None  # the corrupt file was moved away
            return
        if state is None:
            return
        restore_into(self, state)

    def _quarantine(self, cause: str) -> bool:
        """Move corrupt state aside; returns whether it was moved."""
        try:
            where = self.store.quarantine(cause)
        except GridError as exc:
            self.state_warning = (
                f"{cause}; quarantining it failed ({exc}); automatic mode is "
                "refused until the state file is repaired or removed"
            )
            self.automatic_refusal = self.state_warning
            return False
        self.state_warning = (
            f"{cause}; the corrupt file was moved to {where} and the "
            "controller started clean in recommend mode"
        )
        return True

    def _save(self) -> bool:
        """Persist conditionally; on failure show a warning and return False.

        A plain write failure keeps the controller running (it retries on the next save).
        A conflict (the durable state changed since this instance loaded or wrote it) means
        another controller is the writer now: this instance becomes superseded and never
        acts or writes again (specification: a single writer, "Local wire contract").
        """
        if self.superseded:
            return False
        self.book.prune()
        data = encode_state(snapshot_of(self))
        try:
            self.store.save(data, self._state_digest)
        except StateConflictError as exc:
            self._supersede(str(exc))
            return False
        except GridError as exc:
            self.state_warning = f"controller state could not be written: {exc}"
            return False
        self._state_digest = state_digest(data)
        if self.state_warning and self.state_warning.startswith("controller state could not"):
            self.state_warning = None
        return True

    def _supersede(self, cause: str) -> None:
        """Stop for good: another controller wrote the durable state after this one."""
        self.superseded = True
        self.authority = SUPERSEDED
        self.lease_expires_at = 0.0  # stamps no further command and renews nothing
        self.state_warning = cause

    def _refuse_if_superseded(self) -> None:
        """Operator changes on a superseded instance could never be saved: refuse them.

        Raises:
            StateConflictError: this instance is superseded (nothing changes).
        """
        if self.superseded:
            msg = (
                "this controller is superseded (its durable state was written by another "
                "controller) and accepts no changes; restart the Grid server"
            )
            raise StateConflictError(msg)

    def _save_operator_change(self) -> None:
        """Persist an operator change; a conflict is reported, never silently dropped.

        Raises:
            StateConflictError: another controller wrote the state first; this change was
                not saved and this instance is now superseded.
        """
        if not self._save() and self.superseded:
            msg = f"the change was not saved: {self.state_warning}"
            raise StateConflictError(msg)

    # --- inputs -------------------------------------------------------------------------
    def _dirty(self, safety: bool) -> None:
        self.dirty_revision += 1
        if safety:
            self.safety_revision += 1

    def note_input(self, now: float, safety_changed: bool = False) -> None:
        """A registration, heartbeat or removal changed the inputs.

        Args:
            now: wall-clock seconds.
            safety_changed: the change matters to destructive safety (membership, a
                residency state, activity or lifecycle changed) — advances the safety
                revision too.
        """
        del now
        self._dirty(safety_changed)

    projects_unbound = True
    """Unbound (``auto``) requests are projected here, so callers pass them through raw."""

    def observe_request(self, features: RequestFeatures) -> None:
        """Fold one finished request's bounded features into demand history.

        An unbound (``auto``) request whose workload was classified counts as demand for the
        workload's best feasible model as of the last tick, unless a portfolio plugin owns
        unbound demand (specification: "Proactive observation and portfolio planning").
        """
        if features.requested_model == UNBOUND and not self._portfolio_plugin:
            features = project_with(features, self._projection)
        if self.demand.observe(features):
            self.dirty_revision += 1

    def put_profile(self, profile: ModelProfile, now: float) -> ModelProfile:
        """Create or replace a model profile; clears its retirement tombstone.

        Raises:
            ValidationError: the profile is invalid (nothing changes).
            StateConflictError: this controller is superseded (another controller wrote the
                durable state); the change is not saved.
        """
        self._refuse_if_superseded()
        profile = validate_profile(profile)
        self.profiles[profile.model_id] = profile
        self.tombstones.pop(profile.model_id, None)
        self.quality.prune(now, self.profiles)  # a new artifact revision starts uncertain
        self.demand.set_configured(self.profiles)  # count its requests from now on
        self._dirty(True)
        self._save_operator_change()
        return profile

    def remove_profile(self, model_id: str, now: float) -> None:
        """Retire a model: durable tombstone, target zero, cancel its availability work.

        Raises:
            NotFoundError: no profile and no tombstone has this id.
            StateConflictError: this controller is superseded (another controller wrote the
                durable state); the change is not saved.
        """
        self._refuse_if_superseded()
        if model_id not in self.profiles and model_id not in self.tombstones:
            msg = f"model '{model_id}' has no profile; list models with grid allocator status"
            raise NotFoundError(msg)
        self.profiles.pop(model_id, None)
        self.tombstones.setdefault(model_id, now)
        self.demand.set_configured(self.profiles)  # also forgets the retired model's history
        self.quality.prune(now, self.profiles)
        for a in self.book.active():
            if a.model_id == model_id and not a.destructive:
                self.book.close(a, "cancelled", now, "retired")
        self._dirty(True)
        self._save_operator_change()

    def set_mode(self, mode: str, now: float) -> None:
        """Select observe, recommend or automatic.

        Leaving automatic cancels every pending command (a late receipt may still complete
        one that was already running).

        Raises:
            ValidationError: unknown mode.
            ConflictError: automatic was refused (no durable or writable state path, or
                another controller holds the single-writer lease); the mode is unchanged.
            StateConflictError: this controller is superseded (another controller wrote the
                durable state); the change is not saved.
        """
        if mode not in MODES:
            msg = f"mode '{mode}' is unknown; use one of {', '.join(MODES)}"
            raise ValidationError(msg)
        if mode == self.mode and (mode != "automatic" or self.authority == "held"):
            return
        self._refuse_if_superseded()
        if mode == "automatic":
            self._enter_automatic(now)
            if not self._save():
                if self.superseded:
                    msg = f"automatic mode refused: {self.state_warning}"
                    raise StateConflictError(msg)
                self.mode = "recommend"
                self.authority = "none"
                msg = f"automatic mode refused: {self.state_warning}; fix the state path"
                raise ConflictError(msg)
        else:
            if self.mode == "automatic":
                for a in self.book.active():
                    self.book.close(a, "cancelled", now, f"mode changed to {mode}")
            self.mode = mode  # type: ignore[assignment]
            self.authority = "none"
            self._save_operator_change()
        self._dirty(True)

    def _enter_automatic(self, now: float) -> None:
        if self.automatic_refusal is not None:
            msg = f"automatic mode refused: {self.automatic_refusal}"
            raise ConflictError(msg)
        try:
            self.term, self.lease_expires_at = self.store.acquire_lease(
                self.controller_id, now, CONTROLLER_LEASE_S
            )
        except StateError as exc:
            msg = f"automatic mode refused: the lease beside the state file failed: {exc}"
            raise ConflictError(msg) from None
        self.mode = "automatic"
        self.authority = "held"

    def _renew(self, now: float) -> bool:
        """Keep the single-writer lease; returns whether this controller holds authority."""
        if self.mode != "automatic" or self.superseded:
            return False
        # A wall clock that moved backward must not stretch the old deadline: renew then too.
        if self.authority == "held" and self.lease_expires_at - CONTROLLER_LEASE_S <= now < (
            self.lease_expires_at - CONTROLLER_LEASE_S * LEASE_RENEW_FRACTION
        ):
            return True
        try:
            term, expires = self.store.acquire_lease(self.controller_id, now, CONTROLLER_LEASE_S)
        except GridError as exc:
            self.authority = f"lost: {exc}"
            return False
        if term != self.term and self.term:
            self.warnings.append(f"controller term moved from {self.term} to {term}")
        self.term, self.lease_expires_at, self.authority = term, expires, "held"
        return True

    # --- tick ---------------------------------------------------------------------------
    def _holds(
        self, now: float, hosts: Mapping[str, HostSnapshot]
    ) -> tuple[str | None, str | None]:
        """(destructive hold, mutation hold) for this tick."""
        gp = self.policy.governor
        destructive = None
        if self._restored:
            if self._grace_anchor is None or now < self._grace_anchor:
                self._grace_anchor = now  # first tick, or the wall clock moved backward
            if now < self._grace_anchor + gp.restart_grace_s:
                destructive = "restart_grace"
            else:
                self._end_grace(now, hosts)
        fresh_now = frozenset(h for h, s in hosts.items() if fresh(s, gp))
        mutation = None
        if self._hiccup is not None:
            since, lost = self._hiccup
            back = len(lost & fresh_now)
            if now - since < gp.restart_grace_s and back < len(lost) * (1 - gp.hiccup_fraction):
                mutation = "membership_hiccup"
            else:
                self._hiccup = None
        else:
            lost = self._fresh_hosts - fresh_now
            if self._fresh_hosts and len(lost) > len(self._fresh_hosts) * gp.hiccup_fraction:
                self._hiccup = (now, lost)
                mutation = "membership_hiccup"
        if mutation is None:
            self._fresh_hosts = fresh_now
        return destructive or mutation, mutation

    def _end_grace(self, now: float, hosts: Mapping[str, HostSnapshot]) -> None:
        """After the restart grace, restored undelivered commands for absent hosts end."""
        self._restored = False
        for a in self.book.active():
            if a.host_id not in hosts and not a.delivered:
                self.book.close(a, "cancelled", now, "host absent after restart")

    def tick(self, now: float, hosts: Iterable[HostSnapshot]) -> TickResult:
        """One reconciliation pass: forecast, plan, reconcile, and (automatic) issue actions.

        Args:
            now: wall-clock seconds.
            hosts: current host snapshots.

        Returns:
            The generation, plan, reconciliation report and ids of actions issued.
        """
        revision, safety = self.dirty_revision, self.safety_revision
        self.processed_revision = revision
        # Learned warm/load/fetch durations replace the profile priors per host (issue: the
        # fastest eligible load+warm path must use what the nodes actually measured).
        host_map = {h.host_id: h for h in self.timings.apply(hosts, self.profiles, now)}
        self.last_hosts = host_map
        self._projection = projection_map(
            sorted({w for p in self.profiles.values() for w in p.workload_scores}),
            self.profiles.values(),
            host_map.values(),
            self.policy.planner,
        )
        destructive_hold, mutation_hold = self._holds(now, host_map)
        authority = self._renew(now)
        profiles = tuple(self.profiles[k] for k in sorted(self.profiles))
        self.last_forecasts = self.demand.forecast(
            now, profiles, host_map.values(), self.plugins, self.policy.planner
        )
        plan_fn = self._plan_fn or _default_plan_fn()
        # The planner sees in-flight warms and drains so it does not re-choose replicas the
        # fleet is already converging to (reconciliation still judges the reported inventory).
        planned_hosts = penalise_failures(
            with_in_flight((host_map[k] for k in sorted(host_map)), self.book),
            self.book,
            self.profiles,
        )
        plan = plan_fn(
            PlanInputs(
                now=now,
                profiles=profiles,
                hosts=tuple(planned_hosts),
                demand=self.last_forecasts,
                policy=self.policy.planner,
            ),
            self.plugins.planner_hooks(),
        )
        self.sequence += 1
        digest = plan.digest or hashlib.sha256(msgspec.json.encode(plan)).hexdigest()
        self.generation = f"{self.epoch}:{self.sequence:020d}:{digest[:16]}"
        self.last_plan = plan
        clear_proven_blocks(self.blocks, self.book, host_map, now, self.policy.governor)
        result = reconcile(
            ReconcileInputs(
                now=now,
                plan=plan,
                hosts=host_map,
                profiles=self.profiles,
                retired=frozenset(self.tombstones),
                book=self.book,
                policy=self.policy.governor,
                blocked_models=frozenset(self.blocks),
                destructive_hold=destructive_hold,
                mutation_hold=mutation_hold,
            )
        )
        issued: list[str] = []
        withdrawals = result.withdrawals
        if mutation_hold is not None:
            # During a hiccup only safety withdrawals apply; a stale view must not cancel work.
            withdrawals = [w for w in withdrawals if w.status == "withdrawn"]
        proposals = sorted(result.proposals, key=service_key)
        deferred = list(result.deferred)
        if self.mode == "observe":
            deferred += [
                Deferred(kind=p.kind, host_id=p.host_id, model_id=p.model_id, reason="observe_mode")
                for p in proposals
            ]
            proposals, withdrawals = [], []
        elif self.mode == "automatic" and authority:
            self._apply_withdrawals(withdrawals, now)
            adm = admit(proposals, self.book, result.free_mb, self.policy.governor)
            for aid in adm.preempted:
                a = self.book.get(aid)
                if a is not None:
                    self.book.close(a, "cancelled", now, "withdrawn_for_higher_class")
            deferred += adm.deferred
            for action in build_actions(adm.admitted, self.generation, now, self._next_order):
                if self.book.add(action):
                    issued.append(action.action_id)
        else:
            withdrawals = []
        self.last_report = ReconcileReport(
            generation=self.generation,
            mode=self.mode,
            proposals=proposals,
            deferred=deferred,
            withdrawals=withdrawals,
            issued=issued,
            hold=mutation_hold or destructive_hold,
            ready=result.ready,
        )
        self.success_revision = revision
        self.tick_safety_revision = safety
        self.last_tick_at = now
        if self.mode == "automatic" or self.sequence % self.policy.persist_every_ticks == 0:
            self._save()
        return TickResult(
            generation=self.generation,
            plan=plan,
            reconciliation=self.last_report,
            issued=tuple(issued),
        )

    def _next_order(self) -> int:
        self._order += 1
        return self._order

    def _apply_withdrawals(self, withdrawals: Sequence[Withdrawal], now: float) -> None:
        for w in withdrawals:
            a = self.book.get(w.action_id)
            if a is None or not a.active:
                continue
            if w.status == "withdrawn":
                if a.delivered:
                    # It may already be running: block this model's destructive work until
                    # a receipt or a heartbeat proves what happened.
                    ids = self.blocks.setdefault(a.model_id, [])
                    if a.action_id not in ids:
                        ids.append(a.action_id)
                self.book.close(a, "withdrawn", now, w.reason)
            else:
                self.book.close(a, "cancelled", now, w.reason)

    def note_tick_duration(self, seconds: float) -> None:
        """Record how long the caller measured the last tick to take (status shows it)."""
        self.last_tick_duration_ms = round(seconds * 1000.0, 3)

    # --- delivery -----------------------------------------------------------------------
    def deliver(
        self, host_id: str, now: float, hosts: Iterable[HostSnapshot], poll_revision: int
    ) -> Delivery:
        """Commands for one command-bearing heartbeat of ``host_id``.

        Selects the host's active actions the last successful tick allows, durably marks
        them delivered, then revalidates destructive ones against ``hosts`` (the fresh
        registry snapshot) and unmarks and suppresses a model's whole destructive batch if
        any member became unsafe. If marking cannot be made durable, nothing is returned.

        Args:
            host_id: the polling host.
            now: wall-clock seconds (server clock).
            hosts: fresh host snapshots.
            poll_revision: dirty revision observed when the heartbeat arrived.

        Returns:
            The commands (only in automatic mode with authority) and the remaining authority
            in seconds of the server's clock.
        """
        if self.mode != "automatic" or not self._renew(now):
            return Delivery(mode=self.mode, commands=(), lease_ttl_s=0.0)
        host_map = {h.host_id: h for h in hosts}
        gp = self.policy.governor
        hold = (
            self._restored
            and self._grace_anchor is not None
            and (now < self._grace_anchor + gp.restart_grace_s)
        )
        chosen = select(
            [a for a in self.book.active() if a.host_id == host_id],
            host_map.get(host_id),
            now,
            gp,
            availability_ok=self.success_revision >= poll_revision,
            destructive_ok=(
                self.tick_safety_revision == self.safety_revision
                and not hold
                and self._hiccup is None
            ),
            blocked_models=frozenset(self.blocks),
        )
        if not chosen:
            return Delivery(mode=self.mode, commands=(), lease_ttl_s=self._ttl(now))
        fresh_marks = [a for a in chosen if not a.delivered]
        for a in fresh_marks:
            a.delivered_at = now
        if fresh_marks and not self._save():
            for a in fresh_marks:
                a.delivered_at = None
            return Delivery(mode=self.mode, commands=(), lease_ttl_s=self._ttl(now))
        retired = frozenset(self.tombstones)
        unsafe = {
            a.model_id
            for a in chosen
            if a.destructive
            and destructive_problem(a, self.last_plan, host_map, self.profiles, retired, gp)
            is not None
        }
        if unsafe:
            undo = [a for a in fresh_marks if a.destructive and a.model_id in unsafe]
            for a in undo:
                a.delivered_at = None
            if undo and not self._save():
                for a in undo:
                    a.delivered_at = now  # keep the marker: the write's outcome is unknown
                self.warnings.append(
                    "a delivery marker could not be removed durably; the "
                    "command is treated as possibly delivered"
                )
            chosen = [a for a in chosen if not (a.destructive and a.model_id in unsafe)]
        if self.superseded:
            # Another controller wrote the state meanwhile: this instance commands nothing.
            return Delivery(mode=self.mode, commands=(), lease_ttl_s=0.0)
        commands = tuple(self._command(a) for a in chosen)
        return Delivery(mode=self.mode, commands=commands, lease_ttl_s=self._ttl(now))

    def _ttl(self, now: float) -> float:
        # Never more than one lease length, whatever the clocks did.
        return min(CONTROLLER_LEASE_S, max(0.0, self.lease_expires_at - now))

    def _command(self, a: Action) -> Command:
        # Authority is stamped at delivery, so a restored action carries the current term.
        return Command(
            action_id=a.action_id,
            kind=a.kind,
            node_id=a.host_id,
            model_id=a.model_id,
            memory_mb=a.memory_mb,
            plan_generation=self.generation,
            controller_term=self.term,
            controller_id=self.controller_id,
            controller_lease_expires_at=self.lease_expires_at,
            dependencies=list(a.dependencies),
            executable=True,
            reason=a.reason,
            created_at=a.created_at,
            not_before=a.not_before,
            artifact_sha256=a.artifact_sha256,
            artifact_source=a.artifact_source,
            artifact_size_mb=a.artifact_size_mb,
            runtime=a.runtime,
            embeddings=a.kind == "warm" and self._serves_embeddings(a.model_id),
        )

    def _serves_embeddings(self, model_id: str) -> bool:
        profile = self.profiles.get(model_id)
        return profile is not None and profile.serves_embeddings

    def acknowledge(self, host_id: str, acks: Iterable[Acknowledgement], now: float) -> list[str]:
        """Apply node receipts (duplicates harmless, conflicts ignored, late ones complete).

        Args:
            host_id: the authenticated host that sent them.
            acks: its acknowledgements.
            now: receipt time (wall-clock seconds).

        Returns:
            One outcome per acknowledgement (``applied``, ``late``, ``duplicate``,
            ``conflict``, ``unknown`` or ``wrong_host``).
        """
        outcomes = []
        changed = False
        for ack in acks:
            outcome = self.book.acknowledge(
                host_id,
                ack.action_id,
                ack.status,
                now,
                ack.message,
                ack.duration_seconds,
                ack.artifact_fetched,
            )
            outcomes.append(outcome)
            if outcome in ("applied", "late"):
                changed = True
                self._learn_timing(ack, now)
                if ack.status != "running":
                    for model, ids in list(self.blocks.items()):
                        if ack.action_id in ids:
                            ids.remove(ack.action_id)
                            if not ids:
                                del self.blocks[model]
        if changed:
            self._dirty(True)
            self._save()
        return outcomes

    def _learn_timing(self, ack: Acknowledgement, now: float) -> None:
        """Fold a successful load/warm receipt's duration into the learned timings."""
        a = self.book.get(ack.action_id)
        if a is None or ack.status != "succeeded":
            return
        self.timings.observe(
            host_id=a.host_id,
            model_id=a.model_id,
            sha=a.artifact_sha256,
            kind=a.kind,
            artifact_fetched=a.artifact_fetched,
            duration_s=ack.duration_seconds,
            now=now,
        )

    # --- quality evidence ---------------------------------------------------------------
    def record_evaluation(
        self,
        model_id: str,
        workload: str,
        artifact_sha256: str | None,
        score: float,
        now: float,
        *,
        latency_ms: float | None = None,
    ) -> QualityView:
        """Record one labelled evaluation of ``model_id`` on ``workload`` (durable).

        Evidence is keyed by (model, workload, artifact SHA-256); confidence reaches full
        weight after eight fresh evaluations and every sample's weight halves each seven
        days (specification, "Proactive observation and portfolio planning").

        Args:
            model_id: a configured model.
            workload: the workload name the evaluation measured.
            artifact_sha256: the evaluated revision; ``None`` means the configured one.
            score: quality in [0, 1].
            now: wall-clock seconds.
            latency_ms: optional evaluation latency in milliseconds (0 .. one hour).

        Returns:
            The model/workload's evidence after this evaluation.

        Raises:
            NotFoundError: no profile has ``model_id``.
            ConflictError: ``artifact_sha256`` differs from the profile's artifact_sha256.
            StateConflictError: this controller is superseded (another controller wrote the
                durable state); the change is not saved.
            ValidationError: ``score`` outside [0, 1], a bad latency or an empty workload
                (nothing is recorded).
        """
        self._refuse_if_superseded()
        configured = check_evaluation(
            self.profiles.get(model_id), model_id, workload, artifact_sha256, score, latency_ms
        )
        self.quality.record(
            model_id=model_id,
            workload=workload,
            sha=configured,
            score=float(score),
            latency_ms=latency_ms,
            now=now,
        )
        self.dirty_revision += 1  # new evidence forces a fresh solve
        self._save_operator_change()
        return next(
            v
            for v in self.quality.views(self.profiles, now)
            if v.model_id == model_id and v.workload == workload
        )

    # --- status -------------------------------------------------------------------------
    def status(self, now: float, detail: bool = False) -> ControllerStatus:
        """Everything the controller decided, as a JSON-encodable value.

        Args:
            now: wall-clock seconds.
            detail: include host residencies, the full plan and action history.
        """
        return controller_status(self, now, detail)
