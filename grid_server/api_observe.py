"""Read-only observation routes: Prometheus ``/metrics``, the dashboard page and its history.

Visibility follows ``GET /allocator/status``: everything here is readable without the
operator capability and carries nothing secret (no keys, tokens, prompts or affinity keys).
The dashboard's mode switch and kill switch call the existing ``PUT /allocator/mode``, which
still requires the operator capability.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from importlib import resources
from typing import Any

import msgspec
from litestar import Response, get
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath

from grid_core.planner.explain import Explanation, explain
from grid_server.context import ServerContext
from grid_server.metrics import CONTENT_TYPE, FleetCollector, exposition, sample_controller

HISTORY_POINTS = 720
"""Points kept for the dashboard's charts: 24 minutes at one point every two seconds."""
HISTORY_MIN_GAP_S = 2.0
"""Prompt passes can run several times a second; the charts need one point per two seconds."""
DASHBOARD_FILES = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
"""The whole dashboard: one page, one script, one style sheet (no build step, no CDN)."""


ModelPoint = tuple[float, float, int, int]
"""One model at one instant: forecast rate (requests/s), offered concurrency, desired and ready
replicas (an array, to keep 720 points small)."""


class HistoryPoint(msgspec.Struct, frozen=True):
    """Every configured model at one pass (``t``: Unix seconds)."""

    t: float
    models: dict[str, ModelPoint]


class HistoryDocument(msgspec.Struct, frozen=True):
    """``GET /dashboard/history``: points oldest first; each model's point is the array
    ``[request_rate_rps, offered_concurrency, desired, ready]``."""

    points: list[HistoryPoint]


@dataclass
class DemandHistory:
    """A bounded ring of per-model demand, forecast and replica counts, one point per pass."""

    points: deque[HistoryPoint]
    last_at: float = 0.0

    @classmethod
    def empty(cls) -> DemandHistory:
        """A history with room for :data:`HISTORY_POINTS` points."""
        return cls(points=deque(maxlen=HISTORY_POINTS))

    def sample(self, ctl: Any, now: float) -> None:
        """Append the controller's latest forecast and plan (at most every two seconds).

        Reads attributes the controller replaces whole at the end of a pass, so it may run on
        the event loop right after a pass without the controller lock.
        """
        if now - self.last_at < HISTORY_MIN_GAP_S:
            return
        self.last_at = now
        forecasts = ctl.last.forecasts
        plan = ctl.last.plan
        report = ctl.last.report
        desired = plan.desired if plan is not None else {}
        ready = report.ready if report is not None else {}
        models: dict[str, ModelPoint] = {}
        for m in sorted(getattr(ctl, "profiles", {}) or {}):
            f = forecasts.get(m)
            models[m] = (
                round(float(getattr(f, "request_rate_rps", 0.0) or 0.0), 4),
                round(float(getattr(f, "offered_concurrency", 0.0) or 0.0), 4),
                int(desired.get(m, 0)),
                int(ready.get(m, 0)),
            )
        self.points.append(HistoryPoint(t=round(now, 3), models=models))


def _dashboard_file(name: str) -> Response[bytes]:
    kind = DASHBOARD_FILES.get(name)
    if kind is None:
        return Response(content=b"not found", status_code=404, media_type="text/plain")
    data = resources.files("grid_server").joinpath("dashboard", name).read_bytes()
    return Response(content=data, media_type=kind, headers={"cache-control": "no-cache"})


def explain_model(ctl: Any, model_id: str) -> Explanation:
    """Explain ``model_id`` from the controller's latest pass (call under the controller lock).

    The hosts are rebuilt the way the pass showed them to the planner (in-flight work and
    failure penalties included), so the replayed ledger matches the plan.
    """
    from grid_core.reconcile.control import penalise_failures, with_in_flight

    host_map = ctl.last.hosts
    hosts = penalise_failures(
        with_in_flight((host_map[k] for k in sorted(host_map)), ctl.book), ctl.book, ctl.profiles
    )
    return explain(
        model_id,
        list(ctl.profiles.values()),
        list(hosts),
        ctl.last.plan,
        ctl.last.forecasts.get(model_id),
        ctl.policy.planner,
    )


def observe_routes(ctx: ServerContext, history: DemandHistory) -> list[HTTPRouteHandler]:
    """``/metrics``, ``/dashboard``, ``/dashboard/history`` and ``/allocator/explain``."""

    @get("/allocator/explain/{model_id:str}")
    async def explain_route(model_id: FromPath[str]) -> Explanation:
        """Why a model is where it is: desired count, demand, a verdict per host, the binding
        constraint (read-only, public like status)."""
        return await ctx.runner.call(lambda: explain_model(ctx.runner.ctl, model_id))

    @get("/metrics", media_type=CONTENT_TYPE)
    async def metrics() -> Response[bytes]:
        """Prometheus text exposition of the controller, router, nodes and artifact fetches.

        Read-only and public like ``GET /allocator/status``; see docs/observability.md.
        """
        now = time.time()
        sample = await ctx.runner.call(lambda: sample_controller(ctx.runner.ctl, now))
        ctx.metrics.count_finished(sample.finished)
        server = {"ticks": ctx.runner.ticks}
        body = exposition(ctx.metrics, FleetCollector(sample, server, ctx.router))
        return Response(content=body, media_type=CONTENT_TYPE)

    @get("/dashboard/history")
    async def dashboard_history() -> HistoryDocument:
        """Per-model demand, forecast and replica counts over the last minutes (charts)."""
        return HistoryDocument(points=list(history.points))

    @get("/dashboard")
    async def dashboard_page() -> Response[bytes]:
        """The dashboard page (hosts × models, plan vs fleet, charts, recent actions)."""
        return _dashboard_file("index.html")

    @get("/dashboard/{name:str}")
    async def dashboard_file(name: FromPath[str]) -> Response[bytes]:
        """The dashboard's script and style sheet."""
        return _dashboard_file(name)

    return [metrics, dashboard_history, dashboard_page, dashboard_file, explain_route]
