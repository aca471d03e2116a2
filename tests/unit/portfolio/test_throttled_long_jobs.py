"""A throttled host that cannot finish a model's long jobs does not count as serving it.

Specification, host protection (a throttled host stays useful but yields capacity; the drain
grace protects running requests) and "Global placement loop" (a throttled host exposes only
its fraction; make-before-break). A minute-long video job at half capacity outlasts the grace
a protected host gives running work, so the planner and the portfolio do not count that
replica: the model gets a replica on a host that can finish its jobs, with the authority its
demand has, while the throttled one keeps serving until the replacement is ready. Short jobs
on the same throttled host are unaffected.
"""

from __future__ import annotations

from pathlib import Path

from grid_core.controller import Controller
from grid_core.demand.features import RequestFeatures
from grid_core.demand.types import ModelDemand
from grid_core.eligibility import outlasts_protection
from grid_core.planner import Plan, PlanInputs, PlannerPolicy, plan
from grid_core.portfolio.feasibility import Fit
from grid_core.profile import ModelProfile
from grid_core.protection import DRAIN_GRACE_S
from grid_core.snapshot import HostSnapshot, ResidencySnapshot
from grid_core.system.state_file import FileStateStore
from grid_core.testing import plugins_with

NOW = 1_790_000_000.0
BUILTINS = ("grid_forecast_ewma", "grid_scoring", "grid_victims", "grid_portfolio")
POLICY = PlannerPolicy(admission_headroom_mb=0, admission_headroom_fraction=0.0)

VIDEO = ModelProfile(
    model_id="video",
    memory_mb=4_000,
    expected_service_time_s=90.0,
    replica_concurrency=1,
    workload_scores={"video": 1.0},
)
IMAGE = ModelProfile(
    model_id="image",
    memory_mb=4_000,
    expected_service_time_s=8.0,
    replica_concurrency=1,
    workload_scores={"image": 1.0},
)


def _ready(model_id: str, last_used: float | None = None) -> ResidencySnapshot:
    return ResidencySnapshot(
        model_id=model_id,
        memory_mb=4_000,
        state="ready",
        active_requests=0,
        loaded_at=NOW - 7_200,
        last_used_at=last_used,
        routable=True,
    )


def _host(host_id: str, *models: str, throttled: bool = False) -> HostSnapshot:
    """A one-model host with room for exactly one of the catalogue's models."""
    return HostSnapshot(
        host_id=host_id,
        capacity_mb=10_000,
        runtimes=("llama.cpp",),
        heartbeat_age_s=1.0,
        max_models=1,
        state="throttled" if throttled else "accepting",
        throttle_fraction=0.5 if throttled else 1.0,
        residencies=tuple(_ready(m, NOW - 30) for m in models),
    )


def test_a_long_job_outlasts_the_grace_of_a_throttled_host_and_a_short_one_does_not() -> None:
    hot = _host("a", throttled=True)
    cool = _host("b")
    assert outlasts_protection(hot, VIDEO, 0.5)  # 90 s at half capacity > the grace
    assert not outlasts_protection(hot, IMAGE, 0.5)  # 16 s fits well inside it
    assert not outlasts_protection(cool, VIDEO, 0.5)  # an accepting host keeps its work
    lighter = HostSnapshot(**{**_fields(hot), "throttle_fraction": 90.0 / DRAIN_GRACE_S})
    assert not outlasts_protection(lighter, VIDEO, 1.0)  # exactly the grace still finishes


def _fields(h: HostSnapshot) -> dict[str, object]:
    return {f: getattr(h, f) for f in h.__struct_fields__}


def test_the_planner_places_the_model_where_its_jobs_finish() -> None:
    """Video's only replica sits on the throttled host: the plan asks for a replica on the
    free accepting host instead of counting it; image's replica on a throttled host stays."""
    hosts = (_host("a", "video", throttled=True), _host("b"), _host("c", "image", throttled=True))
    demand = {
        "video": ModelDemand(model_id="video", desired_replicas=1, direct=True),
        "image": ModelDemand(model_id="image", desired_replicas=1, direct=True),
    }
    out = plan(
        PlanInputs(now=NOW, profiles=(IMAGE, VIDEO), hosts=hosts, demand=demand, policy=POLICY),
        plugins_with(builtins=("grid_scoring", "grid_victims")).planner_hooks(),
        reuse=False,
    )
    assert out.hosts_of("video") == ("b",)
    assert out.hosts_of("image") == ("c",)


def test_the_portfolio_does_not_count_the_throttled_replica_as_resident() -> None:
    hosts = (_host("a", "video", throttled=True), _host("b", "image", throttled=True))
    fit = Fit((IMAGE, VIDEO), hosts, POLICY, {})
    assert fit.row("video").resident == 0
    assert fit.row("image").resident == 1


def _video_job(at: float, served: str | None) -> RequestFeatures:
    return RequestFeatures(
        at=at,
        endpoint="video",
        requested_model="auto",
        modality="video",
        workload="video",
        served_model=served,
        service_time_s=50.0 if served else None,
        outcome="ok" if served else "unavailable",
    )


def _video_served(tmp_path: Path) -> Controller:
    """An automatic controller with both profiles that has seen four served video jobs
    (mature workload evidence for the replacement rules)."""
    store = FileStateStore(tmp_path / "controller-state.json")
    ctl = Controller(plugins=plugins_with(builtins=BUILTINS), store=store).restore()
    for p in (IMAGE, VIDEO):
        ctl.put_profile(p, NOW)
    ctl.set_mode("automatic", NOW)
    for i in range(4):
        ctl.observe_request(_video_job(NOW + 100 + 40 * i, "video"))
    return ctl


def test_a_throttled_video_host_hands_over_to_an_idle_speculative_replica(
    tmp_path: Path,
) -> None:
    """Video jobs were served on host a, which is now throttled; host b holds an idle image
    replica nobody asks for. Video takes b (the mature 1.5x replacement rule), and video's
    throttled replica is not drained before the replacement is ready."""
    ctl = _video_served(tmp_path)
    hosts = [_host("a", "video", throttled=True), _host("b", "image")]
    result = ctl.tick(NOW + 300, hosts)
    report = ctl.last.portfolio
    assert report is not None and report.replacing is not None
    assert (report.replacing.beneficiary, report.replacing.host_id) == ("video", "b")
    assert report.replacing.victims == ("image",)
    drains = {(p.kind, p.host_id, p.model_id) for p in result.reconciliation.proposals}
    assert ("drain", "b", "image") in drains
    assert ("drain", "a", "video") not in drains
    # Image has drained and unloaded: video is placed on b; a still serves until b is ready.
    result = ctl.tick(NOW + 360, [_host("a", "video", throttled=True), _host("b")])
    assert ctl.last.plan is not None and ctl.last.plan.hosts_of("video") == ("b",)
    kinds = {(p.kind, p.host_id, p.model_id) for p in result.reconciliation.proposals}
    assert ("warm", "b", "video") in kinds
    assert ("drain", "a", "video") not in kinds


def test_a_replica_stranded_on_a_throttled_host_does_not_end_a_starvation_path() -> None:
    """Video's only replica is on throttled host a, where its jobs cannot finish; a
    starvation path freed host b for it and the victim has left. That stranded replica is
    "ready", but it is not the arrival the path waits for: the authorization is carried
    (so the freed host is kept for video), and it ends once video is ready on b."""
    from grid_core.portfolio.replace import carried
    from grid_core.portfolio.types import Replacement

    path = Replacement(
        beneficiary="video",
        workload="video",
        host_id="b",
        victims=("image",),
        pressure=1.0,
        victim_pressure=0.5,
        rule="starvation",
    )
    image_elsewhere = _host("c", "image")
    hosts = (_host("a", "video", throttled=True), _host("b"), image_elsewhere)
    fit = Fit((IMAGE, VIDEO), hosts, POLICY, {})
    assert fit.degraded_pairs() == frozenset({("a", "video")})
    mapping = {"video": "video"}
    assert carried(path, mapping, hosts, fit.out_hosts(), fit.degraded_pairs()) == path
    arrived = (hosts[0], _host("b", "video"), image_elsewhere)
    fit = Fit((IMAGE, VIDEO), arrived, POLICY, {})
    assert carried(path, mapping, arrived, fit.out_hosts(), fit.degraded_pairs()) is None


def test_no_new_replica_goes_where_its_jobs_would_not_finish() -> None:
    """The only host is throttled: a new video replica there would not be counted at the
    next tick, so the plan leaves video short and says why; image's short jobs may use it."""
    hosts = (_host("b", throttled=True),)
    hooks = plugins_with(builtins=("grid_scoring", "grid_victims")).planner_hooks()

    def plan_for(model: str) -> Plan:
        demand = {model: ModelDemand(model_id=model, desired_replicas=1, direct=True)}
        inputs = PlanInputs(
            now=NOW, profiles=(IMAGE, VIDEO), hosts=hosts, demand=demand, policy=POLICY
        )
        return plan(inputs, hooks, reuse=False)

    video = plan_for("video")
    assert video.hosts_of("video") == ()
    (short,) = video.unmet
    assert short.code == "no_eligible_host"
    assert "throttled" in short.message and "protection grace" in short.message
    assert plan_for("image").hosts_of("image") == ("b",)
    fit = Fit((IMAGE, VIDEO), hosts, POLICY, {})
    assert (fit.row("video").feasible, fit.row("image").feasible) == (0, 1)


def test_a_throttled_host_is_no_replacement_path_for_a_long_job_model(tmp_path: Path) -> None:
    """Video's replica is stranded on throttled host a; host b holds an idle image replica
    nobody asks for, but b is throttled too, so a video job could not finish there either.
    Draining image for video would only move the stranding: no path is taken, image keeps
    serving, and nothing is drained."""
    ctl = _video_served(tmp_path)
    hosts = [_host("a", "video", throttled=True), _host("b", "image", throttled=True)]
    assert Fit((IMAGE, VIDEO), tuple(hosts), POLICY, {}).row("video").paths == ()
    result = ctl.tick(NOW + 300, hosts)
    report = ctl.last.portfolio
    assert report is not None and report.replacing is None
    drains = {(p.kind, p.host_id, p.model_id) for p in result.reconciliation.proposals}
    assert not {d for d in drains if d[0] == "drain"}
