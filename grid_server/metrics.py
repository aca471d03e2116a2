"""Prometheus ``/metrics``: the controller, router, nodes and artifact fetches as metric families.

Most families are read at scrape time from state Grid already keeps (controller status, the
action book, the registry, the router's in-flight counts and breakers), so serving inference
pays nothing for them. Only what has no state to read — per-request counts and latencies,
and tick durations — is counted as it happens, through the runner's two observer hooks.

Label cardinality is bounded by the fleet, never by callers: model labels are configured or
routed models (any other requested name becomes ``other``), host labels are registered hosts,
and nothing carries a request id, an affinity key or an engine key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from grid_core.demand.features import RequestFeatures
from grid_core.wire import HostState, Mode, ResidencyState

MB = 1024 * 1024
OTHER_MODEL = "other"
"""Label for a requested model Grid does not know: callers choose names, the fleet does not."""
MAX_CACHED_MODELS = 4096
"""Models whose served-request series are kept looked up; far above any fleet's models (the
labels themselves are bounded by the models Grid knows)."""
MAX_COUNTED_ACTIONS = 65536
"""Finished action ids remembered so each is counted once; far above the action book's size."""
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Grid's own added latency: sub-millisecond on a quiet host, seconds only when overloaded."""
UPSTREAM_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Engine service time: tens of ms for a short completion up to minutes for a long prefill."""
TICK_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""A controller pass: milliseconds on a small fleet, the planner's budget bounds the tail."""
FETCH_BUCKETS_S = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
"""An artifact fetch: seconds for a small GGUF on a LAN up to an hour for a large one."""
CONTENT_TYPE = "text/plain; version=0.0.4"
"""The Prometheus text exposition format."""

MODES: tuple[str, ...] = get_args(Mode)
HOST_STATES: tuple[str, ...] = get_args(HostState)
RESIDENCY_STATES: tuple[str, ...] = get_args(ResidencyState)


class RequestMetrics:
    """Counters and histograms fed as requests finish and passes end (bounded labels).

    Args:
        is_known: whether a model name may appear as a label (configured or routed); any
            other name is counted under :data:`OTHER_MODEL`.
    """

    def __init__(self, is_known: Callable[[str], bool]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._known = is_known
        r = self.registry
        self.requests = Counter(
            "grid_router_requests",
            "Requests the OpenAI-compatible proxy finished, by model and outcome.",
            ["model", "outcome"],
            registry=r,
        )
        self.retry_after = Counter(
            "grid_router_retry_after_responses",
            "503 answers with Retry-After: the model had no ready engine.",
            ["model"],
            registry=r,
        )
        self.added = Histogram(
            "grid_router_added_latency_seconds",
            "Time Grid spent before the upstream hop (body read, parse, route choice).",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.upstream = Histogram(
            "grid_router_upstream_latency_seconds",
            "Engine time from the upstream request to the last relayed byte.",
            ["model"],
            buckets=UPSTREAM_BUCKETS_S,
            registry=r,
        )
        self.tokens = Counter(
            "grid_router_tokens",
            "Tokens of finished requests: prompt (estimated from size) and completion "
            "(engine usage, else the request's max_tokens).",
            ["model", "kind"],
            registry=r,
        )
        self.tick = Histogram(
            "grid_controller_tick_duration_seconds",
            "Duration of one controller pass (forecast, plan, reconcile).",
            buckets=TICK_BUCKETS_S,
            registry=r,
        )
        self.actions = Counter(
            "grid_controller_actions",
            "Actions that reached a final status, by kind and status.",
            ["kind", "status"],
            registry=r,
        )
        self.fetch_bytes = Counter(
            "grid_artifact_fetch_bytes",
            "Bytes of model artifacts nodes downloaded (declared artifact size).",
            ["model"],
            registry=r,
        )
        self.fetch_seconds = Histogram(
            "grid_artifact_fetch_duration_seconds",
            "Duration nodes reported for loads that downloaded the artifact.",
            ["model"],
            buckets=FETCH_BUCKETS_S,
            registry=r,
        )
        self._counted: set[str] = set()
        self._served: dict[str, tuple[Any, Any, Any, Any, Any]] = {}

    def model_label(self, name: str | None) -> str:
        """``name`` when Grid knows the model, else :data:`OTHER_MODEL` (bounded labels)."""
        if name and self._known(name):
            return name
        return OTHER_MODEL

    def observe_request(self, f: RequestFeatures) -> None:
        """Count one finished or refused request (runner hook; never raises)."""
        model = self.model_label(f.served_model or f.requested_model)
        if f.outcome == "ok" and f.service_time_s is not None:
            # The hot path: one served request. Its labelled series are looked up once per
            # model (prometheus_client's labels() takes a lock and builds a key each call).
            served = self._served.get(model)
            if served is None:
                served = self._served_series(model)
            ok, added, upstream, prompt, completion = served
            ok.inc()
            added.observe(max(0.0, f.queue_s))
            upstream.observe(max(0.0, f.service_time_s))
            prompt.inc(f.input_units)
            completion.inc(f.output_units)
            return
        self.requests.labels(model, f.outcome).inc()
        if f.outcome == "unavailable":
            self.retry_after.labels(model).inc()
        if f.service_time_s is not None:
            self.added.labels(model).observe(max(0.0, f.queue_s))
            self.upstream.labels(model).observe(max(0.0, f.service_time_s))
        if f.outcome == "ok":
            self.tokens.labels(model, "prompt").inc(f.input_units)
            self.tokens.labels(model, "completion").inc(f.output_units)

    def _served_series(self, model: str) -> tuple[Any, Any, Any, Any, Any]:
        if len(self._served) >= MAX_CACHED_MODELS:
            self._served.clear()  # labels are bounded by known models; this only bounds memory
        series = (
            self.requests.labels(model, "ok"),
            self.added.labels(model),
            self.upstream.labels(model),
            self.tokens.labels(model, "prompt"),
            self.tokens.labels(model, "completion"),
        )
        self._served[model] = series
        return series

    def observe_tick(self, seconds: float) -> None:
        """Record one controller pass's duration (runner hook)."""
        self.tick.observe(max(0.0, seconds))

    def count_finished(self, finished: Iterable[FinishedAction]) -> None:
        """Count each finished action once (called at scrape time, under the controller lock)."""
        for a in finished:
            if a.action_id in self._counted:
                continue
            if len(self._counted) >= MAX_COUNTED_ACTIONS:
                # The book holds far fewer finished actions than this; forgetting the oldest
                # ids can only re-count actions the book has long dropped.
                self._counted.clear()
            self._counted.add(a.action_id)
            self.actions.labels(a.kind, a.status).inc()
            if a.fetched and a.status == "succeeded":
                self.fetch_bytes.labels(a.model_id).inc(a.fetch_bytes)
                if a.duration_s is not None:
                    self.fetch_seconds.labels(a.model_id).observe(a.duration_s)


@dataclass(frozen=True)
class FinishedAction:
    """What the metrics need of one action (copied under the controller lock)."""

    action_id: str
    kind: str
    status: str
    model_id: str
    fetched: bool
    fetch_bytes: int
    duration_s: float | None


@dataclass
class ControllerSample:
    """The controller's state at one scrape (plain data, copied under the lock).

    Attributes:
        status: the controller's status document (``detail=True``).
        disk_free_mb: host id → free artifact disk (MB) from the last host snapshots.
        active: (kind, status) of every active action.
        finished: actions in a final status.
    """

    status: dict[str, Any]
    disk_free_mb: dict[str, int] = field(default_factory=dict)
    active: list[tuple[str, str]] = field(default_factory=list)
    finished: list[FinishedAction] = field(default_factory=list)


def sample_controller(ctl: Any, now: float) -> ControllerSample:
    """Copy what the metrics read from the controller (call under the controller lock)."""
    import msgspec

    raw = ctl.status(now, True)
    status = raw if isinstance(raw, dict) else msgspec.to_builtins(raw)
    sample = ControllerSample(status=status)
    for h in ctl.last.hosts.values():
        if h.artifact_disk_free_mb is not None:
            sample.disk_free_mb[h.host_id] = h.artifact_disk_free_mb
    profiles = getattr(ctl, "profiles", {}) or {}
    for a in getattr(ctl, "book", ()) or ():
        if a.active:
            sample.active.append((a.kind, a.status))
            continue
        p = profiles.get(a.model_id)
        size_mb = (p.artifact_size_mb or 0) if p is not None else 0
        sample.finished.append(
            FinishedAction(
                action_id=a.action_id,
                kind=a.kind,
                status=a.status,
                model_id=a.model_id,
                fetched=bool(getattr(a, "artifact_fetched", False)),
                fetch_bytes=size_mb * MB,
                duration_s=getattr(a, "duration_s", None),
            )
        )
    return sample


def _sequence(generation: str) -> int:
    """The pass sequence number inside ``epoch:sequence:digest`` (0 before the first plan)."""
    parts = generation.split(":")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else 0


class FleetCollector(Collector):
    """Gauges read from one controller sample, the registry and the router at scrape time."""

    def __init__(self, sample: ControllerSample, server: dict[str, Any], router: Any) -> None:
        self.sample = sample
        self.server = server
        self.router = router

    def collect(self) -> Iterator[Metric]:
        """Yield every scrape-time family (Prometheus ``Collector`` protocol)."""
        st = self.sample.status
        yield from self._controller(st)
        yield from self._models(st)
        yield from self._actions()
        yield from self._nodes(st)
        yield from self._router()

    def _controller(self, st: dict[str, Any]) -> Iterator[Metric]:
        mode = GaugeMetricFamily(
            "grid_controller_mode", "1 for the allocator's current mode.", labels=["mode"]
        )
        for m in MODES:
            mode.add_metric([m], 1.0 if st.get("mode") == m else 0.0)
        yield mode
        yield GaugeMetricFamily(
            "grid_controller_term", "Controller authority term.", value=st.get("controller_term", 0)
        )
        held = GaugeMetricFamily(
            "grid_controller_authority_held", "1 while this controller holds the lease."
        )
        held.add_metric([], 1.0 if st.get("authority") == "held" else 0.0)
        yield held
        expires = st.get("controller_lease_expires_at") or 0.0
        yield GaugeMetricFamily(
            "grid_controller_lease_remaining_seconds",
            "Seconds until the controller lease expires (0 when not held).",
            value=max(0.0, expires - time.time()),
        )
        last = st.get("last_tick_at")
        yield GaugeMetricFamily(
            "grid_controller_last_tick_age_seconds",
            "Seconds since the last controller pass (-1 before the first).",
            value=time.time() - last if last else -1.0,
        )
        yield GaugeMetricFamily(
            "grid_controller_plan_generation",
            "Sequence number of the current plan generation.",
            value=_sequence(str(st.get("generation") or "")),
        )
        yield CounterMetricFamily(
            "grid_controller_passes",
            "Controller passes run by this server.",
            value=self.server.get("ticks") or 0,
        )

    def _models(self, st: dict[str, Any]) -> Iterator[Metric]:
        plan = st.get("plan") or {}
        models = sorted(p["model_id"] for p in st.get("profiles", []))
        desired = plan.get("desired", {})
        placed: dict[str, int] = {}
        for a in plan.get("assignments", []):
            placed[a["model_id"]] = placed.get(a["model_id"], 0) + 1
        ready = (st.get("reconciliation") or {}).get("ready", {})
        forecasts = st.get("forecasts") or {}
        fams = {
            "desired": GaugeMetricFamily(
                "grid_model_desired_replicas", "Replicas the plan wants.", labels=["model"]
            ),
            "placed": GaugeMetricFamily(
                "grid_model_placed_replicas", "Replicas the plan placed.", labels=["model"]
            ),
            "ready": GaugeMetricFamily(
                "grid_model_ready_replicas", "READY replicas on admitting hosts.", labels=["model"]
            ),
            "rate": GaugeMetricFamily(
                "grid_model_demand_requests_per_second",
                "Forecast arrival rate (requests/s).",
                labels=["model"],
            ),
            "conc": GaugeMetricFamily(
                "grid_model_offered_concurrency",
                "Requests in service at once (Little's law) the forecast expects.",
                labels=["model"],
            ),
        }
        for m in models:
            f = forecasts.get(m) or {}
            fams["desired"].add_metric([m], desired.get(m, 0))
            fams["placed"].add_metric([m], placed.get(m, 0))
            fams["ready"].add_metric([m], ready.get(m, 0))
            fams["rate"].add_metric([m], f.get("request_rate_rps", 0.0) or 0.0)
            fams["conc"].add_metric([m], f.get("offered_concurrency", 0.0) or 0.0)
        yield from fams.values()
        unmet = GaugeMetricFamily(
            "grid_model_unmet_replicas",
            "Replicas the plan could not place, by model and unmet reason code.",
            labels=["model", "reason"],
        )
        totals: dict[tuple[str, str], int] = {}
        for u in st.get("unmet", []):
            key = (u["model_id"], u["code"])
            totals[key] = totals.get(key, 0) + int(u.get("missing") or 0)
        for (m, code), n in sorted(totals.items()):
            unmet.add_metric([m, code], n)
        yield unmet

    def _actions(self) -> Iterator[Metric]:
        active = GaugeMetricFamily(
            "grid_controller_active_actions",
            "Actions not yet final, by kind and status.",
            labels=["kind", "status"],
        )
        counts: dict[tuple[str, str], int] = {}
        for key in self.sample.active:
            counts[key] = counts.get(key, 0) + 1
        for (kind, status), n in sorted(counts.items()):
            active.add_metric([kind, status], n)
        yield active

    def _nodes(self, st: dict[str, Any]) -> Iterator[Metric]:
        age = GaugeMetricFamily(
            "grid_node_heartbeat_age_seconds",
            "Seconds since the host's last heartbeat.",
            labels=["host"],
        )
        state = GaugeMetricFamily(
            "grid_node_protection_state",
            "1 for the host's current protection state.",
            labels=["host", "state"],
        )
        mem = GaugeMetricFamily(
            "grid_node_memory_bytes",
            "Host memory: capacity, allocatable, used by models, free.",
            labels=["host", "kind"],
        )
        disk = GaugeMetricFamily(
            "grid_node_artifact_disk_free_bytes",
            "Free disk for model artifacts on the host.",
            labels=["host"],
        )
        res = GaugeMetricFamily(
            "grid_node_residency_state",
            "1 for each model's residency state on each host (absent models are not listed).",
            labels=["host", "model", "state"],
        )
        for h in st.get("hosts", []):
            hid = h["host_id"]
            if h.get("heartbeat_age_s") is not None:
                age.add_metric([hid], h["heartbeat_age_s"])
            for s in HOST_STATES:
                state.add_metric([hid, s], 1.0 if h.get("state") == s else 0.0)
            for kind in ("capacity", "allocatable", "used", "free"):
                mem.add_metric([hid, kind], (h.get(f"{kind}_mb") or 0) * MB)
            if hid in self.sample.disk_free_mb:
                disk.add_metric([hid], self.sample.disk_free_mb[hid] * MB)
            for r in h.get("residencies", []):
                res.add_metric([hid, r["model_id"], r["state"]], 1.0)
        yield from (age, state, mem, disk, res)

    def _router(self) -> Iterator[Metric]:
        router = self.router
        inflight = GaugeMetricFamily(
            "grid_router_inflight_requests",
            "Requests in flight to engines, by host.",
            labels=["host"],
        )
        hosts: dict[str, int] = {}
        for rec in router.registry.records.values():
            if rec.role == "engine":
                n = router.inflight.get(rec.record_id, 0)
                hosts[rec.host_id] = hosts.get(rec.host_id, 0) + n
        for hid, n in sorted(hosts.items()):
            inflight.add_metric([hid], n)
        yield inflight
        breakers = GaugeMetricFamily(
            "grid_router_open_breakers",
            "Engines whose circuit breaker is open for the model.",
            labels=["model"],
        )
        mono = time.monotonic()
        opened: dict[str, int] = {}
        for (_eid, model), b in list(router.breakers.items()):
            if b.is_open(mono):
                opened[model] = opened.get(model, 0) + 1
        for model in sorted(set(router.routed_models()) | set(opened)):
            breakers.add_metric([model], opened.get(model, 0))
        yield breakers


def exposition(metrics: RequestMetrics, fleet: FleetCollector) -> bytes:
    """The text exposition of every family: counted ones and scrape-time ones."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(fleet)

    class _Counted(Collector):
        def collect(self) -> Iterator[Metric]:
            yield from metrics.registry.collect()

    registry.register(_Counted())
    return generate_latest(registry)
