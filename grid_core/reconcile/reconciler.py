"""Desired plan + host snapshots + action history → proposed actions, deferrals, withdrawals.

Pure: nothing here reads a clock or changes the action book. The controller applies the
result (specification, "Reconciliation and modes" and "Safety invariants" 3 to 9):

* missing replicas get a warm (preceded by a load unless the exact weights are cached);
* obsolete managed replicas drain only after every desired replica of the model is READY
  (the planner's staged preemptions are the one exception), then unload once idle;
* pinned, manual and external engines are never touched;
* a pending action that the plan no longer wants is cancelled, and a destructive action that
  fresh evidence made unsafe withdraws the model's whole destructive batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from grid_core.demand.desired import startup_path_s
from grid_core.demand.prefetch import PREDICTIVE_FETCH, Advisory
from grid_core.planner.types import Assignment, Eviction, Plan
from grid_core.profile import ModelProfile, revision_matches
from grid_core.reconcile.actions import Action, ActionBook, ServiceClass, failure_key
from grid_core.reconcile.policy import DRAIN_DEADLINE_REASON, GovernorPolicy
from grid_core.reconcile.timings import DeadlineBasis, warm_deadline_s
from grid_core.reconcile.view import (
    admitting,
    observed_at,
    reachable,
    releases_freely,
    replacement_problem,
    reserved_by_actions,
    used_mb,
)
from grid_core.snapshot import HostSnapshot, ResidencySnapshot
from grid_core.wire import ActionKind


class Proposal(msgspec.Struct, frozen=True, kw_only=True):
    """One action the reconciler wants, before the governor admits it.

    ``load_first`` marks a warm whose weights are not cached: it is issued as a load plus a
    warm that depends on it, and both are admitted or deferred together.
    """

    kind: ActionKind
    host_id: str
    model_id: str
    memory_mb: int = 0
    reason: str
    priority: int = 0
    service_class: ServiceClass = "direct"
    round: int = 0
    """Replica round of the model (0 = its first missing replica); a preemption drain or
    unload carries its beneficiary's round."""
    group_left: int = 0
    """For a preemption: lifecycle transitions its release group (every victim of the same
    beneficiary on the same host) still needs, 2 per ready victim and 1 per draining one."""
    cold_path_s: float = 0.0
    """Estimated seconds until it can serve (load + warm, or warm only when cached)."""
    load_first: bool = False
    eviction: bool = False
    beneficiary: str | None = None
    artifact_sha256: str | None = None
    artifact_source: str | None = None
    artifact_size_mb: int | None = None
    runtime: str | None = None
    ready_timeout_s: float | None = None
    """Warm only: seconds the node waits for readiness before it stops the engine as failed
    (:func:`grid_core.reconcile.timings.warm_deadline_s`)."""
    deadline_basis: DeadlineBasis | None = None
    """Warm only: what set ``ready_timeout_s`` (``floor``, ``profile`` or ``learned``)."""


class Deferred(msgspec.Struct, frozen=True, kw_only=True):
    """Work the reconciler or governor knowingly did not start, and why (visible in status)."""

    kind: str
    host_id: str
    model_id: str
    reason: str
    until: float | None = None


DRAINABLE_STATES = frozenset({"ready", "draining"})
"""Residency states a drain can act on: a serving replica, or one already draining (the same
drain sent again is idempotent). A drain of a failed, cached or starting residency is stale."""


class Withdrawal(msgspec.Struct, frozen=True, kw_only=True):
    """An active action to close: ``cancelled`` (constructive, or a drain never sent) or
    ``withdrawn`` (destructive)."""

    action_id: str
    model_id: str
    status: str
    reason: str


@dataclass
class ReconcileInputs:
    """Everything one reconciliation reads (all immutable or read-only by contract).

    Attributes:
        now: wall-clock seconds (server clock).
        plan: the planner's desired placement.
        hosts: host id → snapshot.
        profiles: configured (non-retired) model profiles by id.
        retired: model ids under a retirement tombstone.
        book: issued actions (read only here).
        policy: governor bounds.
        blocked_models: models whose destructive work waits for a withdrawn batch's receipt.
        destructive_hold: reason destructive work is held fleet-wide (restart grace), or None.
        mutation_hold: reason all new work is held (control-plane hiccup), or None.
        advisories: cache-only predictive fetches and evictions
            (:func:`grid_core.demand.prefetch.plan_prefetch`).
    """

    now: float
    plan: Plan
    hosts: Mapping[str, HostSnapshot]
    profiles: Mapping[str, ModelProfile]
    retired: frozenset[str]
    book: ActionBook
    policy: GovernorPolicy
    blocked_models: frozenset[str] = frozenset()
    destructive_hold: str | None = None
    mutation_hold: str | None = None
    advisories: tuple[Advisory, ...] = ()


@dataclass
class ReconcileResult:
    """What one reconciliation decided (ordered, data only).

    Attributes:
        proposals: wanted actions in service order (the governor admits a prefix).
        deferred: knowingly postponed work with reasons.
        withdrawals: active actions to close.
        free_mb: host id → MB still free for new warms after in-flight reservations.
        ready: model id → READY replicas on routing-eligible hosts.
    """

    proposals: list[Proposal] = field(default_factory=list)
    deferred: list[Deferred] = field(default_factory=list)
    withdrawals: list[Withdrawal] = field(default_factory=list)
    free_mb: dict[str, int] = field(default_factory=dict)
    ready: dict[str, int] = field(default_factory=dict)


def required_replicas(
    model_id: str, plan: Plan, profiles: Mapping[str, ModelProfile], retired: frozenset[str]
) -> int:
    """Replicas that must be proven READY before an obsolete one may drain.

    The plan's desired count, but never below the profile's ``min_replicas``: a plan that
    (by bug or by shortage) asks for fewer than the baseline cannot authorize draining the
    last required replica. A retired model needs none.
    """
    if model_id in retired:
        return 0
    profile = profiles.get(model_id)
    floor = profile.min_replicas if profile is not None else 0
    return max(plan.desired.get(model_id, 0), floor)


def _sha(profiles: Mapping[str, ModelProfile], model_id: str) -> str | None:
    """The artifact revision a replacement of ``model_id`` must prove (``None``: any)."""
    p = profiles.get(model_id)
    return p.artifact_sha256 if p is not None else None


def _cached_exact(host: HostSnapshot, profile: ModelProfile, r: ResidencySnapshot | None) -> bool:
    """The host holds exactly the profile's weights on disk (a digest mismatch is not cached)."""
    want = profile.artifact_sha256
    if r is not None and r.state == "cached":
        return want is None or r.artifact_sha256 == want
    if profile.model_id in host.cached:
        got = host.cached[profile.model_id]
        return want is None or got == want
    return False


def _service_class(index: int, profile: ModelProfile, a: Assignment) -> ServiceClass:
    if index < profile.min_replicas or a.reason == "pin":
        return "baseline"
    if "predict" in a.reason:
        return "predictive"
    return "direct"


def _cold_path_s(host: HostSnapshot, profile: ModelProfile, cached: bool) -> float:
    return startup_path_s(profile, host.performance.get(profile.model_id), cached)


class _Gate:
    """Shared per-(kind, host, model) gates: active equivalents, observation, backoff."""

    def __init__(self, inp: ReconcileInputs) -> None:
        self.inp = inp
        self.active = inp.book.index_active()
        self.last = inp.book.last_finished()

    def check(
        self, kind: str, host: HostSnapshot, model_id: str
    ) -> tuple[str, float | None] | None:
        """``None`` when an action of ``kind`` may be proposed, else (reason, until)."""
        inp = self.inp
        if (kind, host.host_id, model_id) in self.active:
            return ("pending_equivalent", None)
        last = self.last.get((kind, host.host_id, model_id))
        if last is not None and last.status == "succeeded" and last.receipt_at is not None:
            # A report older than the receipt cannot justify repeating the action.
            until = last.receipt_at + inp.policy.observation_timeout_s
            if observed_at(host, inp.now) <= last.receipt_at and inp.now < until:
                return ("awaiting_observation", until)
        rec = inp.book.failures.get(failure_key(kind, host.host_id, model_id))
        if rec is not None and rec.count > 0:
            until = rec.last_at + inp.policy.backoff_s(rec.count)
            if inp.now < until:
                return ("backoff", until)
        return None


def reconcile(inp: ReconcileInputs) -> ReconcileResult:
    """Compare the plan with reality and list what should change.

    Args:
        inp: the inputs (see :class:`ReconcileInputs`).

    Returns:
        Proposals in service order, deferrals, withdrawals and the memory ledger.
    """
    out = ReconcileResult()
    gate = _Gate(inp)
    by_model: dict[str, list[Assignment]] = defaultdict(list)
    for a in inp.plan.assignments:
        by_model[a.model_id].append(a)
    desired_pairs = {(a.model_id, a.host_id) for a in inp.plan.assignments}
    evictions = {(e.model_id, e.host_id): e for e in inp.plan.evictions}
    actions = list(inp.book)
    for h in inp.hosts.values():
        out.free_mb[h.host_id] = (
            h.allocatable_mb - used_mb(h) - reserved_by_actions(h, actions, inp.now)
        )
        if admitting(h, inp.policy):
            for r in h.residencies:
                if r.state == "ready":
                    out.ready[r.model_id] = out.ready.get(r.model_id, 0) + 1

    _constructive(inp, gate, by_model, out)
    proof = {
        m: replacement_problem(
            m,
            by_model.get(m, ()),
            required_replicas(m, inp.plan, inp.profiles, inp.retired),
            inp.hosts,
            inp.policy,
            lease_margin=False,
            artifact_sha256=_sha(inp.profiles, m),
        )
        for m in {r.model_id for h in inp.hosts.values() for r in h.residencies}
    }
    _destructive(inp, gate, desired_pairs, evictions, proof, out)
    if inp.retired:
        _evictions_of_retired(inp, gate, out)
    _predictive_cache(inp, gate, out)
    _withdrawals(inp, desired_pairs, evictions, proof, out)
    if inp.mutation_hold is not None:
        out.deferred.extend(
            Deferred(kind=p.kind, host_id=p.host_id, model_id=p.model_id, reason=inp.mutation_hold)
            for p in out.proposals
        )
        out.proposals = []
    return out


def _constructive(
    inp: ReconcileInputs, gate: _Gate, by_model: dict[str, list[Assignment]], out: ReconcileResult
) -> None:
    """Warms (and loads) for desired replicas that are not there yet."""
    for model_id, assigned in by_model.items():
        profile = inp.profiles.get(model_id)
        if profile is None or model_id in inp.retired:
            continue
        rnd = 0
        for index, a in enumerate(assigned):
            host = inp.hosts.get(a.host_id)
            if host is None:
                continue
            r = host.residency(model_id)
            why = _why_not_warm(inp, host, profile, r)
            if why is not None:
                if why != NOT_NEEDED:
                    out.deferred.append(
                        Deferred(kind="warm", host_id=a.host_id, model_id=model_id, reason=why)
                    )
                continue
            cached = _cached_exact(host, profile, r)
            blocked = gate.check("warm", host, model_id)
            if blocked is None and not cached:
                blocked = gate.check("load", host, model_id)
            if blocked is not None:
                if blocked[0] != "pending_equivalent":
                    out.deferred.append(
                        Deferred(
                            kind="warm",
                            host_id=a.host_id,
                            model_id=model_id,
                            reason=blocked[0],
                            until=blocked[1],
                        )
                    )
                continue
            out.proposals.append(_warm_proposal(host, profile, a, r, cached, index, rnd))
            rnd += 1


NOT_NEEDED = ""
""":func:`_why_not_warm`'s answer when the replica needs no warm and no status row: it is
already there (ready, loading, warming) or is an engine Grid does not actuate."""


def _why_not_warm(
    inp: ReconcileInputs, host: HostSnapshot, profile: ModelProfile, r: ResidencySnapshot | None
) -> str | None:
    """Why an assigned replica cannot be warmed on ``host`` now: ``None`` when it can,
    :data:`NOT_NEEDED` when nothing is missing, else the deferral reason shown in status."""
    if r is not None and not r.actuatable:
        return NOT_NEEDED  # external/manual/pinned engines satisfy demand, never actuated
    if r is not None and r.state in ("ready", "loading", "warming"):
        if not revision_matches(profile, r.artifact_sha256):
            # The old revision holds this host's slot; replacing it in place would take the
            # replica away before the new one serves. It drains once a replica of the new
            # revision is ready elsewhere; until then status says why.
            return "old_revision_here"
        return NOT_NEEDED
    if r is not None and r.state == "draining":
        return "draining_here"
    if not admitting(host, inp.policy):
        return "host_not_admitting"
    return None


def _warm_proposal(
    host: HostSnapshot,
    profile: ModelProfile,
    a: Assignment,
    r: ResidencySnapshot | None,
    cached: bool,
    index: int,
    rnd: int,
) -> Proposal:
    """The warm (with its load first unless exact weights are cached) of the ``index``-th
    assigned replica, in round ``rnd`` of the model's replicas this pass."""
    held = r is not None and r.holds_memory  # a failed residency already holds its memory
    perf = host.performance.get(profile.model_id)
    deadline, basis = warm_deadline_s(profile, perf.warm_s if perf else None)
    return Proposal(
        kind="warm",
        host_id=a.host_id,
        model_id=profile.model_id,
        memory_mb=0 if held else (a.memory_mb or profile.memory_for(host.runtimes)),
        reason="missing_replica",
        priority=profile.priority,
        service_class=_service_class(index, profile, a),
        round=rnd,
        cold_path_s=_cold_path_s(host, profile, cached),
        load_first=not cached,
        artifact_sha256=profile.artifact_sha256,
        artifact_source=profile.artifact_source,
        artifact_size_mb=profile.artifact_size_mb,
        runtime=a.runtime or None,
        ready_timeout_s=deadline,
        deadline_basis=basis,
    )


def _destructive(
    inp: ReconcileInputs,
    gate: _Gate,
    desired_pairs: set[tuple[str, str]],
    evictions: Mapping[tuple[str, str], object],
    proof: Mapping[str, str | None],
    out: ReconcileResult,
) -> None:
    """Drains of obsolete replicas and unloads of idle drained ones."""
    rounds = _beneficiary_rounds(inp.plan)
    left = _group_transitions(inp)
    for host in inp.hosts.values():
        for r in host.residencies:
            if not r.actuatable or r.state in ("cached", "loading", "warming"):
                continue
            key = (r.model_id, host.host_id)
            eviction = evictions.get(key)
            if r.state == "ready" and key in desired_pairs and eviction is None:
                continue
            kind: ActionKind = "drain" if r.state == "ready" else "unload"
            deadline = _drain_deadline(inp, host, r, gate.last) if kind == "unload" else None
            overdue = deadline is not None and inp.now >= deadline
            reason = _destructive_block(inp, host, r, kind, eviction, proof, gate.last)
            if reason in ("in_flight", "activity_unknown") and overdue:
                reason = None  # the drain deadline passed: the controller decides to force
            elif reason in ("in_flight", "activity_unknown") and deadline is not None:
                out.deferred.append(
                    Deferred(
                        kind=kind,
                        host_id=host.host_id,
                        model_id=r.model_id,
                        reason=reason,
                        until=deadline,
                    )
                )
                continue
            if reason is None:
                reason_gate = gate.check(kind, host, r.model_id)
                if reason_gate is not None:
                    if reason_gate[0] != "pending_equivalent":
                        out.deferred.append(
                            Deferred(
                                kind=kind,
                                host_id=host.host_id,
                                model_id=r.model_id,
                                reason=reason_gate[0],
                                until=reason_gate[1],
                            )
                        )
                    continue
            if reason is None and kind == "drain" and isinstance(eviction, Eviction):
                reason = _prefetch_beneficiary(inp, gate, host, eviction, out)
            if reason is not None:
                out.deferred.append(
                    Deferred(kind=kind, host_id=host.host_id, model_id=r.model_id, reason=reason)
                )
                continue
            profile = inp.profiles.get(r.model_id)
            prio = profile.priority if profile is not None else 0
            out.proposals.append(
                Proposal(
                    kind=kind,
                    host_id=host.host_id,
                    model_id=r.model_id,
                    reason=DRAIN_DEADLINE_REASON
                    if overdue and r.active_requests != 0
                    else "eviction"
                    if eviction is not None
                    else ("retired" if r.model_id in inp.retired else "obsolete"),
                    priority=getattr(eviction, "priority", prio),
                    service_class="direct" if eviction is not None else "cleanup",
                    round=rounds.get(key, 0),
                    group_left=left.get(key, 0),
                    eviction=eviction is not None,
                    beneficiary=getattr(eviction, "beneficiary", None),
                )
            )


def _drain_deadline(
    inp: ReconcileInputs,
    host: HostSnapshot,
    r: ResidencySnapshot,
    last: Mapping[tuple[str, str, str], Action],
) -> float | None:
    """When the drain of ``r`` runs out of time (wall seconds), or ``None`` without a known start.

    The start is the node's receipt for the drain it ran (the route was fenced then); a
    replica drained by its host's own protection loop has no such receipt and keeps the
    ordinary rule (only an idle replica is unloaded).
    """
    if r.state != "draining":
        return None
    drain = last.get(("drain", host.host_id, r.model_id))
    if drain is None or drain.status != "succeeded" or drain.receipt_at is None:
        return None
    return drain.receipt_at + inp.policy.drain_deadline_s


def _beneficiary_rounds(plan: Plan) -> dict[tuple[str, str], int]:
    """(victim model, host) → the replica round of the beneficiary its preemption serves.

    A beneficiary already holding ``n`` placed replicas is in round ``n``; its evictions on
    several hosts are its rounds ``n``, ``n + 1``, … in host order. A capacity-release drain
    then queues beside the beneficiary's own warms instead of ahead of every peer's first
    replica (specification, "Safety invariants" 8: preemptions retain the beneficiary round).
    """
    placed: dict[str, int] = defaultdict(int)
    for a in plan.assignments:
        placed[a.model_id] += 1
    out: dict[tuple[str, str], int] = {}
    hosts_of: dict[str, list[str]] = defaultdict(list)
    for e in plan.evictions:
        if e.beneficiary is not None and e.host_id not in hosts_of[e.beneficiary]:
            hosts_of[e.beneficiary].append(e.host_id)
    for e in plan.evictions:
        if e.beneficiary is not None:
            order = sorted(hosts_of[e.beneficiary]).index(e.host_id)
            out[(e.model_id, e.host_id)] = placed[e.beneficiary] + order
    return out


def _group_transitions(inp: ReconcileInputs) -> dict[tuple[str, str], int]:
    """(victim model, host) → transitions its preemption group still needs before the
    beneficiary can start there (drain + unload per ready victim, unload per draining one).

    Under a tight mutation budget the governor finishes the group with the fewest left, so a
    slot is not spent on a partial release that cannot serve traffic yet (specification,
    "Safety invariants" 8).
    """
    groups: dict[tuple[str | None, str], int] = defaultdict(int)
    for e in inp.plan.evictions:
        host = inp.hosts.get(e.host_id)
        r = host.residency(e.model_id) if host is not None else None
        if r is None:
            continue
        groups[(e.beneficiary, e.host_id)] += 2 if r.state == "ready" else 1
    return {(e.model_id, e.host_id): groups[(e.beneficiary, e.host_id)] for e in inp.plan.evictions}


def _prefetch_beneficiary(
    inp: ReconcileInputs, gate: _Gate, host: HostSnapshot, eviction: Eviction, out: ReconcileResult
) -> str | None:
    """Before a preemption drain, fetch the beneficiary's authorized weights onto the host.

    Only when the beneficiary's profile names an exact artifact source: the drain then waits
    for the disk-only download (no memory, no model slot). A load in failure backoff does not
    hold the drain back forever, and the warm still waits for a later plan (specification,
    "Global placement loop", staged preemption).

    Returns:
        Why the drain waits (``prefetching_beneficiary``), or ``None``.
    """
    b = inp.profiles.get(eviction.beneficiary or "")
    if b is None or b.artifact_source is None or _cached_exact(host, b, host.residency(b.model_id)):
        return None
    gated = gate.check("load", host, b.model_id)
    if gated is None:
        out.proposals.append(
            Proposal(
                kind="load",
                host_id=host.host_id,
                model_id=b.model_id,
                reason="prefetch",
                priority=eviction.priority,
                service_class="direct",
                artifact_sha256=b.artifact_sha256,
                artifact_source=b.artifact_source,
                artifact_size_mb=b.artifact_size_mb,
            )
        )
        return "prefetching_beneficiary"
    if gated[0] == "backoff":
        return None
    return "prefetching_beneficiary"


def _predictive_cache(inp: ReconcileInputs, gate: _Gate, out: ReconcileResult) -> None:
    """Cache-only predictive advisories as proposals: a fetch is a ``load`` that only fetches
    and verifies (no warm follows it, no memory, no model slot), an eviction removes one exact
    unused predictive artifact. Both are the lowest service classes, behind real work."""
    for adv in inp.advisories:
        host = inp.hosts.get(adv.host_id)
        if host is None or not reachable(host, inp.policy):
            continue
        kind = "load" if adv.kind == "fetch" else "evict"
        if gate.check(kind, host, adv.model_id) is not None:
            continue
        p = inp.profiles.get(adv.model_id)
        if kind == "load" and p is not None and not _cached_exact(host, p, None):
            out.proposals.append(
                Proposal(
                    kind="load",
                    host_id=host.host_id,
                    model_id=adv.model_id,
                    reason=adv.reason,
                    service_class="predictive",
                    artifact_sha256=adv.artifact_sha256,
                    artifact_source=p.artifact_source,
                    artifact_size_mb=adv.size_mb,
                )
            )
        elif kind == "evict" and host.cached.get(adv.model_id) == adv.artifact_sha256:
            out.proposals.append(
                Proposal(
                    kind="evict",
                    host_id=host.host_id,
                    model_id=adv.model_id,
                    reason=adv.reason,
                    service_class="cleanup",
                    artifact_sha256=adv.artifact_sha256,
                )
            )


def _evictions_of_retired(inp: ReconcileInputs, gate: _Gate, out: ReconcileResult) -> None:
    """Remove the cached weights of retired models from disk (hosts that can evict only)."""
    for host in inp.hosts.values():
        if "evict" not in host.actuator_capabilities or not reachable(host, inp.policy):
            continue
        held = {r.model_id for r in host.residencies if r.holds_memory}
        cached = set(host.cached) | {r.model_id for r in host.residencies if r.state == "cached"}
        for model_id in sorted(cached & inp.retired - held):
            if gate.check("evict", host, model_id) is not None:
                continue
            out.proposals.append(
                Proposal(
                    kind="evict",
                    host_id=host.host_id,
                    model_id=model_id,
                    reason="retired",
                    service_class="cleanup",
                )
            )


def _destructive_block(
    inp: ReconcileInputs,
    host: HostSnapshot,
    r: ResidencySnapshot,
    kind: str,
    eviction: object | None,
    proof: Mapping[str, str | None],
    last: Mapping[tuple[str, str, str], Action],
) -> str | None:
    """Why a drain/unload of ``r`` may not be proposed now, or ``None``.

    ``eviction`` is the plan's staged preemption of ``r`` (``None``: none). A preemption
    drains its victim first, except a make-before-break one (the victim is its model's last
    ready replica and the plan relocates it): that drain waits for the replacement's proof.
    """
    if not reachable(host, inp.policy):
        return "host_unreachable"
    if r.model_id in inp.blocked_models:
        return "destructive_blocked"
    if inp.destructive_hold is not None:
        return inp.destructive_hold
    if kind == "unload":
        if r.state == "failed":
            return None
        if r.active_requests is None:
            return "activity_unknown"
        if r.active_requests > 0:
            return "in_flight"
        return None
    retired = r.model_id in inp.retired
    if isinstance(eviction, Eviction) and eviction.make_before_break and not retired:
        return proof.get(r.model_id)  # the relocated replacement first (invariant 5)
    if eviction is not None or retired:
        return None
    profile = inp.profiles.get(r.model_id)
    # A replica on a fenced host (draining/paused) serves nothing; releasing it removes no
    # availability, so it need not wait for its replacement.
    if not releases_freely(host, inp.policy):
        problem = proof.get(r.model_id)
        if problem is not None:
            return problem  # make before break (a draining host is evacuated, too)
    if (
        admitting(host, inp.policy)
        and profile is not None
        and r.loaded_at is not None
        and inp.now - r.loaded_at < profile.min_residency_s
    ):
        return "min_residency"
    last_warm = last.get(("warm", host.host_id, r.model_id))
    if (
        last_warm is not None
        and last_warm.status == "succeeded"
        and last_warm.receipt_at is not None
        and inp.now - last_warm.receipt_at < inp.policy.mutation_cooldown_s
    ):
        return "mutation_cooldown"
    return None


def _cancelled(a: Action, reason: str) -> Withdrawal:
    """The withdrawal that cancels undelivered action ``a`` for ``reason``."""
    return Withdrawal(action_id=a.action_id, model_id=a.model_id, status="cancelled", reason=reason)


def _unwanted(
    inp: ReconcileInputs, a: Action, host: HostSnapshot | None, desired: bool
) -> str | None:
    """Why an active load or warm is no longer wanted, or ``None`` while it still is.

    A fetch kept for a staged eviction's beneficiary, or for a predictive advisory still in
    force, is wanted though its (host, model) is not desired. ``desired`` says whether the
    plan still assigns the pair.
    """
    prefetch = (
        a.reason == "prefetch"
        and any(e.beneficiary == a.model_id and e.host_id == a.host_id for e in inp.plan.evictions)
    ) or (
        a.reason == PREDICTIVE_FETCH
        and any(
            v.kind == "fetch" and v.model_id == a.model_id and v.host_id == a.host_id
            for v in inp.advisories
        )
    )
    if a.model_id in inp.retired:
        return "retired"
    if not desired and not prefetch:
        return "no_longer_desired"
    if host is not None and not admitting(host, inp.policy) and not a.delivered:
        return "host_not_admitting"
    return None


def _withdrawals(
    inp: ReconcileInputs,
    desired_pairs: set[tuple[str, str]],
    evictions: Mapping[tuple[str, str], object],
    proof: Mapping[str, str | None],
    out: ReconcileResult,
) -> None:
    """Close active actions the plan no longer wants, or that fresh evidence made unsafe."""
    unsafe_models: dict[str, str] = {}
    for a in inp.book.active():
        host = inp.hosts.get(a.host_id)
        key = (a.model_id, a.host_id)
        if a.kind in ("load", "warm"):
            reason = _unwanted(inp, a, host, key in desired_pairs)
            if reason is not None and a.delivered:
                # Delivered: the node may be running it. It keeps its slot until the node's
                # receipt; a surplus replica it creates is drained later as obsolete.
                out.deferred.append(
                    Deferred(
                        kind="cancel",
                        host_id=a.host_id,
                        model_id=a.model_id,
                        reason=f"delivered_not_cancelled:{reason}",
                    )
                )
                continue
            if reason is not None:
                out.withdrawals.append(_cancelled(a, reason))
            continue
        if a.kind != "drain":
            continue
        target = host.residency(a.model_id) if host is not None else None
        if not a.delivered and (target is None or target.state not in DRAINABLE_STATES):
            # The replica died or left before the drain was sent: there is nothing to drain
            # (a failed residency gets its own unload); delivery would refuse it anyway.
            out.withdrawals.append(_cancelled(a, "not_serving"))
            continue
        if a.eviction and not a.delivered and key not in evictions:
            # The latest plan no longer stages this eviction (its beneficiary was placed
            # elsewhere, lost priority or need): the plan's authority for it is gone, and a drain
            # never sent is cancelled for free. A delivered one may be running (left alone).
            out.withdrawals.append(_cancelled(a, "eviction_not_staged"))
            continue
        if a.eviction or a.model_id in inp.retired:
            continue
        if key in desired_pairs and key not in evictions:
            unsafe_models.setdefault(a.model_id, "desired_again")
            continue
        fenced = host is not None and releases_freely(host, inp.policy)
        problem = proof.get(a.model_id)
        if problem is not None and not fenced:
            unsafe_models.setdefault(a.model_id, problem)
    for a in inp.book.active():
        if a.destructive and a.model_id in unsafe_models:
            out.withdrawals.append(
                Withdrawal(
                    action_id=a.action_id,
                    model_id=a.model_id,
                    status="withdrawn",
                    reason=unsafe_models[a.model_id],
                )
            )
