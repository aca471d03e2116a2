"""Unbound workload demand becomes direct demand for the best feasible model."""

from __future__ import annotations

from grid_core.demand.features import RequestFeatures
from grid_core.demand.workloads import best_model_for, project_unbound, projection_map
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot


def _p(mid: str, mem: int, scores: dict, **kw) -> ModelProfile:
    return ModelProfile(model_id=mid, memory_mb=mem, workload_scores=scores, **kw)


PROFILES = (
    _p("big-coder", 60_000, {"coding": 1.0}),
    _p("cuda-coder", 8_000, {"coding": 0.95}, runtimes=("vllm",)),
    _p("small-coder", 8_000, {"coding": 0.8, "general": 0.4}),
    _p("generalist", 8_000, {"general": 0.9, "coding": 0.5}),
)
HOST = HostSnapshot(
    host_id="mac",
    capacity_mb=32_000,
    reserved_mb=4_000,
    heartbeat_age_s=0.0,
    runtimes=("llama.cpp",),
)


def _auto(**kw) -> RequestFeatures:
    base = {"at": 1.0, "endpoint": "chat", "requested_model": "auto", "workload": "coding"}
    base.update(kw)
    return RequestFeatures(**base)


def test_the_highest_scoring_model_that_fits_some_host_wins() -> None:
    # big-coder does not fit in memory; cuda-coder has no runtime here.
    assert best_model_for("coding", PROFILES, [HOST]) == "small-coder"
    assert best_model_for("video", PROFILES, [HOST]) is None


def test_stale_or_paused_hosts_make_nothing_feasible() -> None:
    stale = HostSnapshot(
        **{**{f: getattr(HOST, f) for f in HOST.__struct_fields__}, "heartbeat_age_s": 10_000.0}
    )
    assert best_model_for("coding", PROFILES, [stale]) is None


def test_projection_counts_the_arrival_but_not_a_fallback_model_evidence() -> None:
    served_elsewhere = _auto(
        served_model="generalist", service_time_s=9.0, queue_s=2.0, outcome="error"
    )
    out = project_unbound(served_elsewhere, PROFILES, [HOST])
    assert out.requested_model == "small-coder"
    assert (out.service_time_s, out.queue_s, out.outcome) == (None, 0.0, "ok")
    unrouted = project_unbound(_auto(outcome="unavailable"), PROFILES, [HOST])
    assert (unrouted.requested_model, unrouted.outcome) == ("small-coder", "unavailable")
    served_here = _auto(served_model="small-coder", service_time_s=3.0)
    assert project_unbound(served_here, PROFILES, [HOST]).service_time_s == 3.0


def test_named_and_unclassified_requests_are_unchanged() -> None:
    named = _auto(requested_model="generalist")
    assert project_unbound(named, PROFILES, [HOST]) is named
    unclassified = _auto(workload=None)
    assert project_unbound(unclassified, PROFILES, [HOST]) is unclassified


def test_the_map_agrees_with_the_single_lookup() -> None:
    mapping = projection_map(("coding", "general", "video"), PROFILES, [HOST])
    assert mapping == {"coding": "small-coder", "general": "generalist"}


def test_the_controller_projects_unbound_requests_unless_a_portfolio_plugin_does(lab) -> None:
    from grid_core import hookimpl
    from grid_core.scenario.catalog import build_catalog
    from grid_core.scenario.strategies import ControllerControl
    from grid_core.testing import plugins_with

    class Portfolio:
        @hookimpl
        def grid_search_portfolio(self, snapshot, ctx):
            return None

    profiles = tuple(e.profile for e in build_catalog(3))
    plain = ControllerControl("smart", lab.plugins, lab.store_factory(), profiles, 0.0)
    assert not plain.ctl._portfolio_plugin
    with_portfolio = plugins_with(
        ("portfolio", Portfolio()), builtins=("grid_scoring", "grid_victims")
    )
    switched = ControllerControl("smart", with_portfolio, lab.store_factory(), profiles, 0.0)
    assert switched.ctl._portfolio_plugin
