"""The controller: one tick turns demand and host snapshots into a plan and safe commands.

Pure and synchronous: no sockets, threads or clock reads; every method takes ``now``
(wall-clock Unix seconds) and the caller serialises access (one lock in the server).
Specification: "Reconciliation and modes", "Safety invariants" 3–9, "Local wire contract"
(generations, controller term and lease, dirty/safety revisions, destructive revalidation)
and the restart rules at the end of "HTTP control surface".

The controller is made of parts it owns, each with a small interface of its own:
:class:`~grid_core.reconcile.authority.Authority` (mode, lease, term),
:class:`~grid_core.reconcile.holds.Holds` (restart grace, membership hiccup),
:class:`~grid_core.reconcile.revisions.Revisions` (causal counters),
:class:`~grid_core.reconcile.generation.Generations` (plan names),
:class:`~grid_core.reconcile.state.DurableState` (the durable document) and
:class:`~grid_core.reconcile.delivery.Dispatcher` (the delivery step of a poll). What a tick
may do in each mode, the report status shows and the wire command of a delivery are built in
:mod:`grid_core.reconcile.issuing`. Building a controller does no I/O;
:meth:`Controller.restore` reads the durable document once, before any other call.

Lifecycle in the server::

    ctl = Controller(plugins=plugins, store=FileStateStore(path))   # no I/O
    ctl.restore()                            # reads (or quarantines) the durable document
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
from collections.abc import Callable, Iterable

import msgspec

from grid_core import planner
from grid_core.demand import DemandTracker, ModelDemand, RequestFeatures
from grid_core.demand.inference import Released, plan_with_predictions, without_residencies
from grid_core.demand.prefetch import prediction_homes, prefetch_for_plan
from grid_core.demand.tracker import UNBOUND
from grid_core.errors import ConflictError, GridError, NotFoundError, StateError
from grid_core.planner.hooks import PlannerHooks
from grid_core.planner.types import Plan, PlanInputs
from grid_core.plugins import Plugins
from grid_core.portfolio.evidence import OutcomeBook
from grid_core.portfolio.feasibility import Fit
from grid_core.portfolio.run import PortfolioPass, TickInputs
from grid_core.portfolio.types import AdmissionThresholds
from grid_core.profile import ModelProfile, check_profile_version, validate_profile
from grid_core.reconcile.actions import AckOutcome, ActionBook
from grid_core.reconcile.authority import Authority, check_mode
from grid_core.reconcile.control import (
    ControllerPolicy,
    Delivery,
    TickResult,
    clear_proven_blocks,
    penalise_failures,
    with_in_flight,
)
from grid_core.reconcile.delivery import Dispatcher, FreshHosts
from grid_core.reconcile.generation import Generations
from grid_core.reconcile.holds import Holds
from grid_core.reconcile.issuing import issue
from grid_core.reconcile.quality import QualityBook, QualityView, check_evaluation
from grid_core.reconcile.reconciler import ReconcileInputs, reconcile
from grid_core.reconcile.revisions import Revisions
from grid_core.reconcile.state import ControllerState, DurableState
from grid_core.reconcile.status import (
    ControllerRecords,
    ControllerStatus,
    LastTick,
    controller_status,
)
from grid_core.reconcile.timings import TimingBook
from grid_core.snapshot import HostSnapshot
from grid_core.store import StateConflictError, StateStore
from grid_core.wire import Acknowledgement, Mode

__all__ = ["Controller", "ControllerPolicy", "Delivery", "TickResult"]

PlanFn = Callable[[PlanInputs, PlannerHooks], Plan]


class Controller:
    """Owns desired state, the action book and the parts that decide what it may do.

    Args:
        plugins: the plugin facade (forecaster, score terms, victim selection).
        store: durable state store (read by :meth:`restore`, never by the constructor).
        policy: controller, planner and governor tunables.
        plan_fn: the planner (defaults to :func:`grid_core.planner.plan`; tests inject one).
        controller_id: identity stamped on commands (random when omitted).

    Attributes:
        authority: mode, single-writer lease and term (:class:`Authority`).
        holds: restart grace and membership hiccup (:class:`Holds`).
        revisions: dirty/safety/processed/success counters (:class:`Revisions`).
        generations: plan generation epoch and sequence (:class:`Generations`).
        document: the durable document in ``store`` (:class:`DurableState`).
        profiles: configured profiles by model id.
        tombstones: retired model id → retirement time (wall-clock seconds).
        book: issued actions and their bounded history.
        blocks: model id → withdrawn delivered destructive action ids awaiting proof.
        demand / quality / timings: demand history, labelled quality, learned durations.
        last: what the latest tick saw and decided.
        warnings: notable events status shows (the latest 16).
    """

    projects_unbound = True
    """Unbound (``auto``) requests are kept as workload demand here, so callers pass them
    through raw."""

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
        self.policy = policy or ControllerPolicy()
        self._plan_fn: PlanFn = plan_fn or planner.plan
        self.warnings: list[str] = []
        self.document = DurableState(store)
        self.authority = Authority(
            store,
            controller_id or secrets.token_hex(8),
            warn=self.warnings.append,
            lease_s=self.policy.controller_lease_s,
        )
        self.holds = Holds(self.policy.governor)
        self.revisions = Revisions()
        self.generations = Generations(secrets.token_hex(8))
        self.profiles: dict[str, ModelProfile] = {}
        self.tombstones: dict[str, float] = {}
        self.book = ActionBook()
        self.blocks: dict[str, list[str]] = {}
        self.demand = DemandTracker(self.policy.forecast)
        self.quality = QualityBook()
        self.timings = TimingBook()
        self.last = LastTick()
        self.dispatcher = Dispatcher(
            authority=self.authority,
            revisions=self.revisions,
            holds=self.holds,
            generations=self.generations,
            last=self.last,
            policy=self.policy.governor,
            save=self._save,
            warn=self.warnings.append,
        )
        self._portfolio_plugin = plugins.has_impl("grid_search_portfolio")
        self.portfolio = PortfolioPass(
            plugins if self._portfolio_plugin else None,
            plugins.first_impl("grid_search_portfolio") or "plugin",
            self.warnings.append,
        )

    @property
    def mode(self) -> Mode:
        """Current mode (readable without the server lock)."""
        return self.authority.mode

    # --- durable state ------------------------------------------------------------------
    def restore(self) -> Controller:
        """Read the durable document once and continue from it; returns this controller.

        Call exactly once, before any other method. A corrupt document is quarantined and
        the controller starts clean in recommend mode with a visible warning. A restored
        automatic mode resumes only when durable writes are possible, and then takes its lease
        (term + 1) on the first tick or poll, never here (no clock is read).

        Raises:
            StateError: ``restore`` was already called (nothing changes).
        """
        if self.document.loaded:
            msg = "controller state is already restored; build a new Controller to reload it"
            raise StateError(msg)
        state = self.document.load()
        if self.document.refusal is not None:
            self.authority.refuse_automatic(self.document.refusal)
        if state is not None:
            self._adopt(state)
        return self

    def _adopt(self, state: ControllerState) -> None:
        """Load a decoded document into the parts (implausible evidence rows are dropped)."""
        self.generations.restore(state.epoch, state.sequence)
        self.profiles = {p.model_id: p for p in state.profiles}
        self.tombstones = dict(state.tombstones)
        self.book = ActionBook(state.actions, state.failures)
        self.blocks = {m: list(ids) for m, ids in state.blocks.items()}
        self.quality = QualityBook(state.quality)
        self.portfolio.outcomes = OutcomeBook(state.outcomes)
        self.portfolio.thresholds = state.admission or AdmissionThresholds()
        self.timings = TimingBook(state.timings)
        dropped = (len(state.quality) - len(self.quality), len(state.timings) - len(self.timings))
        if any(dropped):
            self.warnings.append(
                f"implausible evidence discarded on restore: {dropped[0]} "
                f"quality and {dropped[1]} timing rows"
            )
        self.demand.set_configured(self.profiles)
        if state.demand is not None:
            try:
                self.demand.from_state(state.demand)
            except GridError as exc:
                self.warnings.append(f"demand history discarded: {exc}")
        self.holds.restored()
        if not self.authority.resume(state.mode):
            stamps = [a.completed_at or a.created_at for a in self.book]
            for a in self.book.active():
                self.book.close(
                    a, "cancelled", max(stamps, default=0.0), "automatic mode not resumed"
                )

    def _document(self) -> ControllerState:
        """The durable part of this controller (profiles sorted for stable bytes)."""
        return ControllerState(
            epoch=self.generations.epoch,
            sequence=self.generations.sequence,
            mode=self.authority.mode,
            profiles=[self.profiles[k] for k in sorted(self.profiles)],
            tombstones=dict(self.tombstones),
            actions=list(self.book),
            failures=dict(self.book.failures),
            blocks={m: list(v) for m, v in self.blocks.items()},
            demand=self.demand.to_state(),
            quality=self.quality.entries(),
            timings=self.timings.entries(),
            outcomes=self.portfolio.outcomes.entries(),
            admission=self.portfolio.thresholds,
        )

    def _require_restored(self) -> None:
        """Refuse work before :meth:`restore`: it could overwrite durable state unseen.

        Raises:
            StateError: :meth:`restore` has not run yet.
        """
        if not self.document.loaded:
            msg = "the controller's durable state is not restored yet; call restore() first"
            raise StateError(msg)

    def _save(self) -> bool:
        """Persist conditionally; on failure show a warning and return False.

        A plain write failure keeps the controller running (it retries on the next save).
        A conflict (the durable state changed since this instance loaded or wrote it) means
        another controller is the writer now: this instance becomes superseded and never
        acts or writes again (specification: a single writer, "Local wire contract").
        """
        if self.authority.superseded:
            return False
        self.book.prune()
        try:
            return self.document.save(self._document())
        except StateConflictError:
            self.authority.supersede()
            return False

    def _refuse_if_superseded(self) -> None:
        """Operator changes on a superseded instance could never be saved: refuse them.

        Raises:
            StateConflictError: this instance is superseded (nothing changes).
        """
        if self.authority.superseded:
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
        if not self._save() and self.authority.superseded:
            msg = f"the change was not saved: {self.document.warning}"
            raise StateConflictError(msg)

    # --- inputs -------------------------------------------------------------------------
    def note_input(self, now: float, safety_changed: bool = False) -> None:
        """A registration, heartbeat or removal changed the inputs.

        Args:
            now: wall-clock seconds.
            safety_changed: the change matters to destructive safety (membership, a
                residency state, activity or lifecycle changed) — advances the safety
                revision too.
        """
        del now
        self.revisions.note(safety=safety_changed)

    def observe_request(self, features: RequestFeatures) -> None:
        """Fold one finished request's bounded features into demand history.

        A named request is direct demand for that model. An unbound (``auto``) request whose
        workload was classified is workload demand, kept apart: it never becomes direct demand
        for the model that happened to serve it, whose measured outcome is recorded as
        outcome evidence instead (specification: "Proactive observation and portfolio
        planning").
        """
        if features.requested_model == UNBOUND:
            self.portfolio.outcomes.observe(features, self.profiles)
        if self.demand.observe(features):
            self.revisions.note(safety=False)

    def put_profile(
        self, profile: ModelProfile, now: float, *, expected_version: str | None = None
    ) -> ModelProfile:
        """Create or replace a model profile; clears its retirement tombstone.

        Args:
            profile: the new profile.
            now: wall-clock seconds.
            expected_version: the version the writer read (:func:`profile_version`), ``""``
                when it read no profile (create only), ``None`` for an unconditional write.

        Raises:
            ValidationError: the profile is invalid (nothing changes).
            VersionConflictError: ``expected_version`` is not the stored version (nothing
                changes; the error carries both versions).
            StateConflictError: this controller is superseded (another controller wrote the
                durable state); the change is not saved.
            StateError: :meth:`restore` has not run yet.
        """
        self._require_restored()
        self._refuse_if_superseded()
        profile = validate_profile(profile)
        if expected_version is not None:
            check_profile_version(self.profiles.get(profile.model_id), expected_version, profile)
        self.profiles[profile.model_id] = profile
        self.tombstones.pop(profile.model_id, None)
        self.quality.prune(now, self.profiles)  # a new artifact revision starts uncertain
        self.demand.set_configured(self.profiles)  # count its requests from now on
        self.revisions.note(safety=True)
        self._save_operator_change()
        return profile

    def remove_profile(self, model_id: str, now: float) -> None:
        """Retire a model: durable tombstone, target zero, cancel its availability work.

        Raises:
            NotFoundError: no profile and no tombstone has this id.
            StateConflictError: this controller is superseded (another controller wrote the
                durable state); the change is not saved.
            StateError: :meth:`restore` has not run yet.
        """
        self._require_restored()
        self._refuse_if_superseded()
        if model_id not in self.profiles and model_id not in self.tombstones:
            msg = f"model '{model_id}' has no profile; list models with grid allocator status"
            raise NotFoundError(msg)
        self.profiles.pop(model_id, None)
        self.tombstones.setdefault(model_id, now)
        self.demand.set_configured(self.profiles)  # also forgets the retired model's history
        self.quality.prune(now, self.profiles)
        for a in self.book.active():
            # A delivered warm may be running on its node: it keeps its slot until the
            # receipt, and the replica it makes is drained as retired afterwards.
            if a.model_id == model_id and not a.destructive and not a.delivered:
                self.book.close(a, "cancelled", now, "retired")
        self.revisions.note(safety=True)
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
            StateError: :meth:`restore` has not run yet.
        """
        self._require_restored()
        chosen = check_mode(mode)
        if self.authority.settled(chosen):
            return
        self._refuse_if_superseded()
        if chosen == "automatic":
            self.authority.enter_automatic(now)
            if not self._save():
                if self.authority.superseded:
                    msg = f"automatic mode refused: {self.document.warning}"
                    raise StateConflictError(msg)
                self.authority.leave("recommend")
                msg = f"automatic mode refused: {self.document.warning}; fix the state path"
                raise ConflictError(msg)
        else:
            if self.authority.mode == "automatic":
                for a in self.book.active():
                    self.book.close(a, "cancelled", now, f"mode changed to {chosen}")
            self.authority.leave(chosen)
            self._save_operator_change()
        self.revisions.note(safety=True)

    # --- tick ---------------------------------------------------------------------------
    def _end_grace(self, now: float, hosts: Iterable[str]) -> None:
        """After the restart grace, restored undelivered commands for absent hosts end."""
        present = frozenset(hosts)
        for a in self.book.active():
            if a.host_id not in present and not a.delivered:
                self.book.close(a, "cancelled", now, "host absent after restart")

    def _plan(self, now: float, host_map: dict[str, HostSnapshot]) -> Plan:
        """The tick's planning step: forecast, run the portfolio pass, plan.

        Records the forecasts and the portfolio decision in ``self.last`` for status.
        """
        profiles = tuple(self.profiles[k] for k in sorted(self.profiles))
        direct = self.demand.forecast(
            now, profiles, host_map.values(), self.plugins, self.policy.planner
        )
        # The planner sees in-flight warms and drains so it does not re-choose replicas the
        # fleet is already converging to (reconciliation still judges the reported inventory).
        planned_hosts = tuple(
            penalise_failures(
                with_in_flight((host_map[k] for k in sorted(host_map)), self.book),
                self.book,
                self.profiles,
            )
        )
        hooks = self.plugins.planner_hooks()
        portfolio = self.portfolio.run(
            TickInputs(
                now=now,
                profiles=profiles,
                hosts=planned_hosts,
                direct=direct,
                forecasts=self.demand.workload_forecasts(now, self.plugins),
                outcomes=self.portfolio.outcomes,
                quality={
                    (v.model_id, v.workload): (v.score, v.confidence)
                    for v in self.quality.views(self.profiles, now)
                },
                policy=self.policy.planner,
                headroom=self.demand.policy.headroom,
                thresholds=self.portfolio.thresholds,
                previous=self.portfolio.last,
            ),
            lambda inputs: self._plan_fn(inputs, hooks),
        )
        # A replacement's victim shows as leaving its path host (the portfolio's view).
        planned_hosts = portfolio.hosts or planned_hosts
        self.last.predictions = self.demand.infer(
            self.plugins.infer_demand,
            portfolio.demand,
            portfolio.report.mapping,
            (profiles, planned_hosts, self.policy.planner),
            now,
        )

        def plan_of(demand: dict[str, ModelDemand], released: Released) -> Plan:
            hosts = without_residencies(planned_hosts, released)
            inputs = PlanInputs(
                now=now, profiles=profiles, hosts=hosts, demand=demand, policy=self.policy.planner
            )
            return self._plan_fn(inputs, hooks)

        plan, self.last.forecasts = plan_with_predictions(
            plan_of, portfolio.demand, self.last.predictions, self.profiles
        )
        self.last.homes = prediction_homes(
            plan_of, self.last.forecasts, self.last.predictions, plan.assignments, self.profiles
        )
        self.last.portfolio = self.portfolio.finish(
            portfolio, plan, host_map, Fit(profiles, planned_hosts, self.policy.planner, direct)
        )
        return plan

    def tick(self, now: float, hosts: Iterable[HostSnapshot]) -> TickResult:
        """One reconciliation pass: forecast, plan, reconcile, and (automatic) issue actions.

        Args:
            now: wall-clock seconds.
            hosts: current host snapshots.

        Returns:
            The generation, plan, reconciliation report and ids of actions issued.
        """
        self._require_restored()
        started = self.revisions.begin_tick()
        # Learned warm/load/fetch durations replace the profile priors per host (issue: the
        # fastest eligible load+warm path must use what the nodes actually measured).
        host_map = {h.host_id: h for h in self.timings.apply(hosts, self.profiles, now)}
        self.last.hosts = host_map
        holds = self.holds.for_tick(now, host_map)
        if holds.grace_ended:
            self._end_grace(now, host_map)
        destructive_hold, mutation_hold = holds.destructive, holds.mutation
        authority = self.authority.renew(now)
        plan = self._plan(now, host_map)
        digest = plan.digest or hashlib.sha256(msgspec.json.encode(plan)).hexdigest()
        generation = self.generations.next(digest)
        self.last.plan = plan
        clear_proven_blocks(self.blocks, self.book, host_map, now, self.policy.governor)
        last = self.last
        last.prefetch = prefetch_for_plan(
            now,
            plan.assignments,
            host_map,
            self.profiles,
            last.predictions,
            last.forecasts,
            last.homes,
            self.policy.planner.predictive_floor_mb,
        )
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
                advisories=self.last.prefetch.advisories,
            )
        )
        self.last.report = issue(
            result,
            mode=self.authority.mode,
            authority=authority,
            generation=generation,
            book=self.book,
            blocks=self.blocks,
            policy=self.policy.governor,
            now=now,
            destructive_hold=destructive_hold,
            mutation_hold=mutation_hold,
        )
        self.revisions.finish_tick(started)
        self.last.at = now
        if (
            self.last.report.mode == "automatic"
            or self.generations.sequence % self.policy.persist_every_ticks == 0
        ):
            self._save()
        return TickResult(
            generation=generation,
            plan=plan,
            reconciliation=self.last.report,
            issued=tuple(self.last.report.issued),
        )

    def note_tick_duration(self, seconds: float) -> None:
        """Record how long the caller measured the last tick to take (status shows it)."""
        self.last.duration_ms = round(seconds * 1000.0, 3)

    # --- delivery -----------------------------------------------------------------------
    def deliver(
        self,
        host_id: str,
        now: float,
        hosts: Iterable[HostSnapshot],
        poll_revision: int,
        fresh_hosts: FreshHosts | None = None,
    ) -> Delivery:
        """Commands for one command-bearing heartbeat of ``host_id`` (the delivery step).

        Selection, the durable delivery marker and the final destructive revalidation are
        :meth:`Dispatcher.deliver <grid_core.reconcile.delivery.Dispatcher.deliver>`.

        Args:
            host_id: the polling host.
            now: wall-clock seconds (server clock).
            hosts: host snapshots the selection uses.
            poll_revision: dirty revision observed when the heartbeat arrived.
            fresh_hosts: re-reads the raw registry and returns ``(now, snapshots)`` at that
                moment; called once, after the delivery marker is durable.

        Returns:
            The commands (only in automatic mode with authority) and the remaining authority
            in seconds of the server's clock.

        Raises:
            StateError: :meth:`restore` has not run yet.
        """
        self._require_restored()
        return self.dispatcher.deliver(
            host_id, now, hosts, poll_revision, self._records(), fresh_hosts
        )

    def _records(self) -> ControllerRecords:
        """The records a restore replaces, as one value for the delivery step and status."""
        return ControllerRecords(
            profiles=self.profiles,
            tombstones=self.tombstones,
            book=self.book,
            blocks=self.blocks,
            quality=self.quality,
            timings=self.timings,
        )

    def acknowledge(
        self, host_id: str, acks: Iterable[Acknowledgement], now: float
    ) -> list[AckOutcome]:
        """Apply node receipts (duplicates harmless, conflicts ignored, late ones complete).

        Args:
            host_id: the authenticated host that sent them.
            acks: its acknowledgements.
            now: receipt time (wall-clock seconds).

        Returns:
            One outcome per acknowledgement (``applied``, ``late``, ``duplicate``,
            ``conflict``, ``unknown`` or ``wrong_host``).
        """
        self._require_restored()
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
            self.revisions.note(safety=True)
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
            StateError: :meth:`restore` has not run yet.
        """
        self._require_restored()
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
        self.revisions.note(safety=False)  # new evidence forces a fresh solve
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
        return controller_status(
            authority=self.authority,
            document=self.document,
            revisions=self.revisions,
            holds=self.holds,
            generation=self.generations.current,
            records=self._records(),
            last=self.last,
            warnings=self.warnings,
            policy=self.policy.governor,
            now=now,
            detail=detail,
        )
