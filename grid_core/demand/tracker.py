"""The demand tracker: bounded per-model series in, desired replica counts out.

Source: specification, "Global placement loop" (short-horizon demand, target replica count,
rising-demand projection, scale-down cooldown) and "Proactive observation and portfolio
planning" (bounded features, approximate request-level p95).

Pure: ``now`` is always passed in. Two kinds of series are kept apart: direct named-model
demand (one series per configured model) and unbound workload demand (one series per workload
of the vocabulary, fed by ``model: auto`` requests the classifier named). A workload series
never becomes a model's direct series: the portfolio planner projects it onto models at
planning time as demand that may fill spare capacity but never evict
(:mod:`grid_core.portfolio`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from grid_core.demand.coactivation import CoActivationBook
from grid_core.demand.desired import (
    LIVE_EVIDENCE_BUCKETS,
    desired_for,
    eligible_hosts,
    errors_live,
    named_share,
)
from grid_core.demand.features import RequestFeatures
from grid_core.demand.inference import InferenceSource, InferredDemand, workload_models
from grid_core.demand.sequence import SequenceBook, stage_of
from grid_core.demand.series import (
    DemandSeries,
    Forecast,
    ForecastPolicy,
    ForecastSource,
    latency_bin,
    percentile_ms,
)
from grid_core.demand.types import ModelDemand, Watermark
from grid_core.errors import StateError
from grid_core.profile import WORKLOADS, ModelProfile
from grid_core.snapshot import HostSnapshot

STATE_VERSION = 1
"""Version of :meth:`DemandTracker.to_state`; an unknown version is refused, never guessed."""
EPSILON = 1e-9
"""Guards ceil() against float noise (3.0000000001 replicas is 3, not 4)."""
COUNTED_OUTCOMES = frozenset({"ok", "error", "rejected", "unavailable"})
"""Outcomes that are demand; caller-caused 4xx never count for or against a model."""
ERROR_OUTCOMES = frozenset({"error", "rejected"})
UNBOUND = "auto"
"""The model name clients use for unbound work."""
RECENT_ARRIVALS = 8
"""Arrival times remembered per workload for the admission gate (bounded state; the gate
needs three)."""
ADMISSION_MEMORY_S = 3600.0
"""How long a workload's arrivals count toward the admission gate: one hour. The forecast
window (ten minutes) is too short for a sparse but recurring need — an image job every
seven minutes never shows three requests in ten minutes, yet it is an ongoing need that
deserves a canary on spare capacity (it still never evicts anything)."""


class _State(msgspec.Struct, kw_only=True):
    version: int
    configured: list[str]
    series: list[DemandSeries]
    watermarks: dict[str, Watermark]
    workloads: list[DemandSeries] = []
    recent: dict[str, list[float]] = {}
    sequences: dict[str, object] | None = None
    coactivation: dict[str, object] | None = None
    served_unbound: list[DemandSeries] = []


REFUSED_EVIDENCE_S = 30.0
"""Extra seconds a refused request (Grid answered "no ready engine") or a client's retry stays
live evidence: the caller was told to come back within the longest Retry-After Grid advises
(``grid_core.routing.MAX_COLD_RETRY_AFTER_S``), so its demand is still present while it waits;
otherwise a cold model would lose its preemption authority while its caller waits."""


def live_until(series: DemandSeries | None) -> float | None:
    """When the latest named request leaves the live window (Unix seconds), or ``None``.

    The bucket holding it stays live while it fills and for :data:`LIVE_EVIDENCE_BUCKETS`
    completed buckets after it; a bucket with refused requests or retries
    :data:`REFUSED_EVIDENCE_S` longer.
    """
    if series is None:
        return None
    out: float | None = None
    for b in series.buckets:
        if b.requests <= 0 and b.retried <= 0:
            continue
        until = (b.index + LIVE_EVIDENCE_BUCKETS + 1) * series.bucket_s
        if b.unavailable or b.retried:
            until += REFUSED_EVIDENCE_S
        out = until if out is None else max(out, until)
    return out


def errors_until(series: DemandSeries | None) -> float | None:
    """When the bucket holding the window's latest failed request ends (Unix seconds), or
    ``None`` without failures (see :func:`~grid_core.demand.desired.errors_live`)."""
    if series is None:
        return None
    ends = [(b.index + 1) * series.bucket_s for b in series.buckets if b.errors > 0]
    return max(ends) if ends else None


def _live(series: DemandSeries | None, now: float) -> bool:
    """Whether a named request is still live evidence at ``now`` (see :func:`live_until`)."""
    until = live_until(series)
    return until is not None and now < until


def fallback_forecast(series: DemandSeries | None, now: float, policy: ForecastPolicy) -> Forecast:
    """Plain window average used when no forecaster plugin answers (no trend, no confidence)."""
    if series is None or not series.buckets:
        return Forecast(rate_rps=0.0)
    window_s = policy.bucket_s * len(series.buckets)
    requests = sum(b.requests for b in series.buckets)
    served = sum(b.served for b in series.buckets)
    service = sum(b.service_s for b in series.buckets) / served if served else None
    errors = sum(b.errors for b in series.buckets)
    return Forecast(
        rate_rps=requests / window_s,
        service_time_s=service,
        queued=sum(b.queue_s for b in series.buckets) / window_s,
        p95_ms=percentile_ms([b.latency for b in series.buckets]),
        error_rate=errors / requests if requests else 0.0,
    )


class DemandTracker:
    """Per-model bounded demand series and the persisted scale-down watermark.

    Only configured model ids get a series (the inference endpoint is open; arbitrary names
    must not grow controller state). Call :meth:`set_configured` (or :meth:`forecast`, which
    does it from the profiles) whenever the catalog changes.
    """

    def __init__(self, policy: ForecastPolicy | None = None) -> None:
        self.policy = policy or ForecastPolicy()
        self._configured: set[str] = set()
        self._series: dict[str, DemandSeries] = {}
        self._watermarks: dict[str, Watermark] = {}
        self._short: dict[str, float] = {}
        """Per model, when its current uninterrupted shortfall was first forecast
        (:attr:`ModelDemand.short_since`). Not persisted: after a restart a shortfall must be
        seen again before it counts as persistent, which only delays, never permits."""
        self._workloads: dict[str, DemandSeries] = {}
        self._recent: dict[str, list[float]] = {}
        self._served_unbound: dict[str, DemandSeries] = {}
        """Per configured model, unbound requests it served (counts only, never demand): the
        share of its engines' in-flight work that is not named traffic (:func:`named_share`)."""
        self.sequences = SequenceBook()
        """Affinity-key workflows (:mod:`grid_core.demand.sequence`)."""
        self.coactivation = CoActivationBook()
        """Per-minute activity of configured models (:mod:`grid_core.demand.coactivation`)."""

    # --- observation ----------------------------------------------------------------------
    def set_configured(self, model_ids: Iterable[str]) -> None:
        """Declare the configured, non-retiring ids; series of other ids are dropped."""
        self._configured = set(model_ids)
        for gone in [m for m in self._series if m not in self._configured]:
            self.forget(gone)
        self.coactivation.forget(self._configured)

    def observe(self, features: RequestFeatures) -> bool:
        """Fold one finished request into its model's current bucket.

        Only the model the caller named counts as direct demand; the model that happened to
        serve an ``auto`` request does not. An ``auto`` request the classifier named goes to
        its workload's series instead (workload demand, kept apart). Returns whether the
        request was counted.
        """
        if features.outcome not in COUNTED_OUTCOMES or features.evaluation:
            return False  # evaluation traffic (operator-marked) is never demand
        self.sequences.observe(
            features.affinity_hash, stage_of(features, self._configured), features.at
        )
        model = features.requested_model
        if model in self._configured and not features.retry:
            self.coactivation.observe(model, features.at)
        if model == UNBOUND:
            self._count_served_unbound(features)
            if features.workload not in WORKLOADS:
                return False
            store, key = self._workloads, str(features.workload)
            if not features.retry:
                times = self._recent.setdefault(key, [])
                times.append(features.at)
                times.sort()
                del times[:-RECENT_ARRIVALS]
        elif model in self._configured:
            store, key = self._series, model
        else:
            return False
        series = store.get(key)
        if series is None:
            series = DemandSeries(model_id=key, bucket_s=self.policy.bucket_s, buckets=[])
            store[key] = series
        bucket = series.bucket_at(features.at, self.policy.window_buckets)
        if features.retry:
            bucket.retried += 1  # liveness only: never counted as demand again
        else:
            # Demand counts distinct requests: a client's retry of a request already
            # counted (issue 16, item 5) only adds its service evidence below.
            bucket.requests += 1
            if features.outcome in ERROR_OUTCOMES:
                bucket.errors += 1
            elif features.outcome == "unavailable":
                bucket.unavailable += 1
        queue_s = max(0.0, features.queue_s) if math.isfinite(features.queue_s) else 0.0
        if not features.retry:
            bucket.queue_s += queue_s
        st = features.service_time_s
        if st is not None and math.isfinite(st) and st >= 0 and features.outcome == "ok":
            bucket.service_s += st
            bucket.served += 1
            b = latency_bin((st + queue_s) * 1000.0)
            bucket.latency[b] = bucket.latency.get(b, 0) + 1
        return True

    def _count_served_unbound(self, features: RequestFeatures) -> None:
        """Count an unbound request against the configured model that served it (a retry
        was counted already)."""
        served = features.served_model
        if served is None or served not in self._configured or features.retry:
            return
        series = self._served_unbound.get(served)
        if series is None:
            series = DemandSeries(model_id=served, bucket_s=self.policy.bucket_s, buckets=[])
            self._served_unbound[served] = series
        series.bucket_at(features.at, self.policy.window_buckets).requests += 1

    def _share(self, model_id: str, series: DemandSeries | None, now: float, keep: int) -> float:
        """The named part of ``model_id``'s in-flight work over the window (see
        :func:`~grid_core.demand.desired.named_share`)."""
        unbound = self._served_unbound.get(model_id)
        if unbound is not None:
            unbound.prune(now, keep)
            if not unbound.buckets:
                del self._served_unbound[model_id]
                unbound = None
        named = sum(b.requests for b in series.buckets) if series is not None else 0
        served = sum(b.requests for b in unbound.buckets) if unbound is not None else 0
        return named_share(float(named), float(served))

    def forget(self, model_id: str) -> None:
        """Drop a model's series, watermark and shortfall record (profile removed or
        retiring)."""
        self._series.pop(model_id, None)
        self._watermarks.pop(model_id, None)
        self._short.pop(model_id, None)
        self._served_unbound.pop(model_id, None)

    def series(self, model_id: str) -> DemandSeries | None:
        """The model's bounded series (read-only use), if it has one."""
        return self._series.get(model_id)

    def workload_forecasts(
        self, now: float, plugins: ForecastSource
    ) -> dict[str, tuple[Forecast, int]]:
        """Forecast of every workload with unbound demand in the window, and its request count.

        Args:
            now: planning instant (Unix seconds).
            plugins: the plugin facade (its ``forecast``: the ``grid_forecast`` hook).

        Returns:
            workload → (forecast, distinct requests observed within
            :data:`ADMISSION_MEMORY_S`, at most :data:`RECENT_ARRIVALS`). A workload without
            requests in that hour is dropped.
        """
        out: dict[str, tuple[Forecast, int]] = {}
        for name in sorted(set(self._workloads) | set(self._recent)):
            times = [t for t in self._recent.get(name, []) if now - t < ADMISSION_MEMORY_S]
            if times:
                self._recent[name] = times
            else:
                self._recent.pop(name, None)
            series = self._workloads.get(name)
            if series is not None:
                series.prune(now, self.policy.window_buckets)
                if not series.buckets:
                    del self._workloads[name]
                    series = None
            if series is None and not times:
                continue
            fc = plugins.forecast(series, now, self.policy) if series is not None else None
            if not isinstance(fc, Forecast):
                fc = fallback_forecast(series, now, self.policy)
            out[name] = (fc, len(times))
        return out

    # --- forecasting ----------------------------------------------------------------------
    def forecast(
        self,
        now: float,
        profiles: Iterable[ModelProfile],
        hosts: Iterable[HostSnapshot],
        plugins: ForecastSource,
        policy: object | None = None,
    ) -> dict[str, ModelDemand]:
        """Demand and desired replicas of every configured model at ``now``.

        Args:
            now: planning instant (Unix seconds).
            profiles: configured models; ids not listed lose their series.
            hosts: host snapshots (ready replicas, engine queues, startup estimates).
            plugins: the plugin facade (its ``forecast``: the ``grid_forecast`` hook).
            policy: a :class:`ForecastPolicy` overriding the tracker's, or a planner policy
                (its ``stale_heartbeat_s``/``future_skew_s`` decide host eligibility).

        Returns:
            model id → :class:`ModelDemand`, for every profile.
        """
        fpolicy = policy if isinstance(policy, ForecastPolicy) else self.policy
        profiles = sorted(profiles, key=lambda p: p.model_id)
        hosts = sorted(hosts, key=lambda h: h.host_id)
        self.set_configured(p.model_id for p in profiles)
        planner_policy = policy if not isinstance(policy, ForecastPolicy) else None
        eligible = eligible_hosts(hosts, planner_policy)
        out: dict[str, ModelDemand] = {}
        for profile in profiles:
            series = self._series.get(profile.model_id)
            if series is not None:
                series.prune(now, fpolicy.window_buckets)
            fc = None
            if series is not None and series.buckets:
                fc = plugins.forecast(series, now, fpolicy)
            if not isinstance(fc, Forecast):
                fc = fallback_forecast(series, now, fpolicy)
            demand, watermark = desired_for(
                profile,
                fc,
                hosts,
                now,
                fpolicy,
                self._watermarks.get(profile.model_id),
                planner_policy,
                eligible,
                live=_live(series, now),
                share=self._share(profile.model_id, series, now, fpolicy.window_buckets),
                failing=errors_live(errors_until(series), now, fpolicy),
            )
            until = live_until(series)
            if until is not None:
                demand = msgspec.structs.replace(demand, live_until=until)
            demand = self._shortfall(demand, now)
            if watermark is None:
                self._watermarks.pop(profile.model_id, None)
            else:
                self._watermarks[profile.model_id] = watermark
            out[profile.model_id] = demand
        return out

    def _shortfall(self, demand: ModelDemand, now: float) -> ModelDemand:
        """``demand`` with :attr:`ModelDemand.short_since` set while its live direct need
        exceeds its ready replicas; the record ends on the first forecast without it."""
        mid = demand.model_id
        if not demand.live_shortfall():
            self._short.pop(mid, None)
            return demand
        since = self._short.setdefault(mid, now)
        return msgspec.structs.replace(demand, short_since=since)

    def infer(
        self,
        answer: InferenceSource,
        demand: Mapping[str, ModelDemand],
        chosen: Mapping[str, str],
        fleet: tuple[Sequence[ModelProfile], Sequence[HostSnapshot], object | None],
        now: float,
    ) -> list[InferredDemand]:
        """Inferred demand from the learned workflows and co-activation at ``now``.

        Args:
            answer: the plugin facade's ``infer_demand`` (the ``grid_infer_demand`` hook).
            demand: this tick's demand per configured model.
            chosen: workload → model the portfolio chose (a predicted workload stage lands
                there, else on the best feasible model).
            fleet: (profiles, hosts, planner policy) for that fallback projection.
            now: planning instant (Unix seconds).
        """
        profiles, hosts, policy = fleet
        mapping = workload_models(chosen, profiles, hosts, policy, self.sequences.workflows)
        return answer(self.sequences, self.coactivation, demand, mapping, now)

    # --- persistence ----------------------------------------------------------------------
    def to_state(self) -> dict[str, object]:
        """A JSON-compatible snapshot (bounded: window buckets per configured model)."""
        state = _State(
            version=STATE_VERSION,
            configured=sorted(self._configured),
            series=[self._series[k] for k in sorted(self._series)],
            watermarks=dict(sorted(self._watermarks.items())),
            workloads=[self._workloads[k] for k in sorted(self._workloads)],
            recent={k: list(v) for k, v in sorted(self._recent.items())},
            sequences=self.sequences.to_state(),
            coactivation=self.coactivation.to_state(),
            served_unbound=[self._served_unbound[k] for k in sorted(self._served_unbound)],
        )
        document: dict[str, object] = msgspec.to_builtins(state)  # a Struct encodes to a dict
        return document

    def from_state(self, data: dict[str, object]) -> None:
        """Restore :meth:`to_state` output; replaces the current state wholly or not at all.

        Raises:
            StateError: the snapshot is malformed or of an unknown version (nothing changes).
        """
        try:
            state = msgspec.convert(data, _State, strict=False)
        except msgspec.ValidationError as exc:
            msg = f"demand state: {exc}; delete the demand section to start from no history"
            raise StateError(msg) from None
        if state.version != STATE_VERSION:
            msg = (
                f"demand state version {state.version} is not {STATE_VERSION}; "
                "delete the demand section to start from no history"
            )
            raise StateError(msg)
        sequences, coactivation = SequenceBook(), CoActivationBook()
        if state.sequences is not None:
            sequences.from_state(state.sequences)
        if state.coactivation is not None:
            coactivation.from_state(state.coactivation)
        self.sequences, self.coactivation = sequences, coactivation
        self._configured = set(state.configured)
        self._series = {s.model_id: s for s in state.series if s.model_id in self._configured}
        self._watermarks = {k: v for k, v in state.watermarks.items() if k in self._configured}
        self._workloads = {s.model_id: s for s in state.workloads if s.model_id in WORKLOADS}
        self._recent = {
            k: sorted(v)[-RECENT_ARRIVALS:] for k, v in state.recent.items() if k in WORKLOADS
        }
        self._served_unbound = {
            s.model_id: s for s in state.served_unbound if s.model_id in self._configured
        }
