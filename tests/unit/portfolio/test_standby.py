"""Standby: idle capacity holds each workload's chosen model before its first request.

Specification, "Proactive observation and portfolio planning": counterfactual demand may
fill spare capacity but never evicts, and real demand reclaims it first. These tests drive
the production controller (with the built-in portfolio search) on small fleets.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from grid_core.controller import Controller
from grid_core.demand.features import RequestFeatures
from grid_core.demand.types import STANDBY_REASON, ModelDemand
from grid_core.planner import NO_HOOKS, PlanInputs, plan
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot
from grid_core.system.state_file import FileStateStore
from grid_core.testing import plugins_with

NOW = 1_790_000_000.0
WITH_SEARCH = ("grid_forecast_ewma", "grid_scoring", "grid_victims", "grid_portfolio")
WITHOUT_SEARCH = ("grid_forecast_ewma", "grid_scoring", "grid_victims")

GENERAL = ModelProfile(
    model_id="general",
    memory_mb=2_000,
    min_replicas=1,
    priority=10,
    workload_scores={"general": 0.8, "coding": 0.4},
)
CODER = ModelProfile(
    model_id="coder", memory_mb=2_000, max_replicas=8, workload_scores={"coding": 0.95}
)
VIDEO = ModelProfile(
    model_id="video",
    memory_mb=3_000,
    expected_service_time_s=90.0,
    load_estimate_s=60.0,
    warm_estimate_s=30.0,
    workload_scores={"video": 0.9},
)


def _host(host_id: str, *residents: str, active: int = 0) -> HostSnapshot:
    return HostSnapshot(
        host_id=host_id,
        capacity_mb=8_000,
        runtimes=("llama.cpp",),
        heartbeat_age_s=1.0,
        max_models=1,
        residencies=tuple(
            ResidencySnapshot(
                model_id=m,
                memory_mb=3_000 if m == "video" else 2_000,
                state="ready",
                active_requests=active,
                loaded_at=NOW - 7_200,
                routable=True,
            )
            for m in residents
        ),
    )


def _controller(tmp: Path, builtins: tuple[str, ...] = WITH_SEARCH) -> Controller:
    store = FileStateStore(tmp / "controller-state.json")
    ctl = Controller(plugins=plugins_with(builtins=builtins), store=store).restore()
    for p in (GENERAL, CODER, VIDEO):
        ctl.put_profile(p, NOW)
    return ctl


def _hosts(n: int) -> list[HostSnapshot]:
    return [_host(f"h{i}") for i in range(1, n + 1)]


def test_idle_hosts_hold_every_unseen_workloads_leader_before_any_request(
    tmp_path: Path,
) -> None:
    """Five empty one-slot hosts and one short coding request (below the admission gate):
    the baseline takes one host, two slots stay free (one unseen workload, one node failure),
    and the video and coding workloads' leaders stand by on the other two."""
    ctl = _controller(tmp_path)
    ctl.observe_request(
        RequestFeatures(
            at=NOW - 30,
            endpoint="chat",
            requested_model="auto",
            workload="coding",
            served_model="general",
            service_time_s=1.0,
            outcome="ok",
        )
    )
    ctl.tick(NOW, _hosts(5))
    report, p = ctl.last.portfolio, ctl.last.plan
    assert report is not None and p is not None
    assert report.standby == {"coding": "coder", "video": "video"}
    assert {a.model_id for a in p.assignments} == {"general", "coder", "video"}
    assert len(p.assignments) == 3 and not p.evictions
    assert ctl.last.forecasts["video"].reasons[-1] == STANDBY_REASON
    assert not ctl.last.forecasts["video"].direct
    row = next(r for r in report.admissions if r.workload == "coding")
    assert row.state == "awaiting-plan" and "coder stands by on idle capacity" in row.reason


def test_a_small_fleet_keeps_its_margin_free(tmp_path: Path) -> None:
    """Three hosts: after the baseline, the two idle slots are the reserve for an unseen
    workload and a node failure, so nothing stands by."""
    ctl = _controller(tmp_path)
    ctl.tick(NOW, _hosts(3))
    report, p = ctl.last.portfolio, ctl.last.plan
    assert report is not None and p is not None
    assert report.standby == {}
    assert {a.model_id for a in p.assignments} == {"general"}
    assert report.standby_reason == (
        "no standby: the 2 idle host(s) are the spare-capacity reserve (one unseen workload, "
        "one node failure)"
    )


def test_status_says_why_nothing_stands_by(tmp_path: Path) -> None:
    """No idle host at all, or every unadmitted workload's leader already planned by real
    demand: each is named, so an operator can tell the reserve, a full fleet and a leader
    that is already resident apart."""
    ctl = _controller(tmp_path)
    ctl.tick(NOW, _hosts(1))
    report = ctl.last.portfolio
    assert report is not None and report.standby == {}
    assert report.standby_reason.startswith("no standby: no idle host")
    ctl = _controller(tmp_path / "baselines")
    for profile in (CODER, VIDEO):  # each kept resident by the operator's minimum
        ctl.put_profile(msgspec.structs.replace(profile, min_replicas=1), NOW)
    ctl.tick(NOW, _hosts(6))
    report, p = ctl.last.portfolio, ctl.last.plan
    assert report is not None and p is not None
    assert {a.model_id for a in p.assignments} == {"general", "coder", "video"}
    assert report.standby == {}
    assert report.standby_reason == (
        "no standby: already planned by real demand: coding->coder, general->general, video->video"
    )


def test_when_every_unseen_workload_is_covered_only_the_node_failure_slot_stays_free(
    tmp_path: Path,
) -> None:
    """Four hosts: after the baseline, three idle slots. The leaders of every unadmitted
    workload (coder, video) fit beside the node-failure slot, so the unseen-workload slot has
    nothing left to wait for: both stand by and one slot stays free. When one unadmitted
    workload's leader fits no idle host now (research's model needs more than an empty host
    offers beside the admission headroom), that workload is still uncovered and the ordinary
    reserve applies: only video stands by."""
    ctl = _controller(tmp_path)
    ctl.tick(NOW, _hosts(4))
    report, p = ctl.last.portfolio, ctl.last.plan
    assert report is not None and p is not None
    assert report.standby == {"coding": "coder", "video": "video"}
    assert len(p.assignments) == 3 and not p.evictions
    big = ModelProfile(model_id="big", memory_mb=7_900, workload_scores={"research": 0.9})
    ctl = _controller(tmp_path / "uncovered")
    ctl.put_profile(big, NOW)
    ctl.tick(NOW, _hosts(4))
    report = ctl.last.portfolio
    assert report is not None and report.standby == {"video": "video"}


def test_a_leader_already_standing_by_keeps_its_slot_inside_the_margin(tmp_path: Path) -> None:
    """The same three hosts, but the video model already stands by on h2 (idle, long past its
    cooldown): the reserve stops new standby loads, yet the video replica is not unloaded just
    to leave the slot empty; coding's leader, not resident, still gets nothing."""
    ctl = _controller(tmp_path)
    ctl.tick(NOW, [_host("h1", "general"), _host("h2", "video"), _host("h3")])
    report, p = ctl.last.portfolio, ctl.last.plan
    assert report is not None and p is not None
    assert report.standby == {"video": "video"}
    assert p.hosts_of("video") == ("h2",) and p.hosts_of("coder") == ()
    assert not p.evictions
    assert not ctl.last.forecasts["video"].direct


def test_a_leader_returns_inside_the_margin_after_real_demand_borrowed_its_host(
    tmp_path: Path,
) -> None:
    """Video stands by on h2 inside the margin; real demand then borrows h2 (the coder runs
    there) and gives it back. The standby decision stands: once one minimum residency has
    passed since video's replica left, video returns to an idle host although the two idle
    slots are only the reserve; sooner, the host stays free for the borrower. A controller
    that never stood video by keeps the reserve empty."""
    ctl = _controller(tmp_path)
    ctl.tick(NOW, [_host("h1", "general"), _host("h2", "video"), _host("h3")])
    report = ctl.last.portfolio
    assert report is not None and report.standby == {"video": "video"}
    assert report.standby_claims["video"].model_id == "video"
    ctl.tick(NOW + 60, [_host("h1", "general"), _host("h2", "coder"), _host("h3")])
    freed = [_host("h1", "general"), _host("h2"), _host("h3")]
    ctl.tick(NOW + 120, freed)
    report, p = ctl.last.portfolio, ctl.last.plan
    assert report is not None and p is not None
    assert report.standby == {} and p.hosts_of("video") == ()
    assert report.standby_claims["video"].stood_by_at == NOW
    ctl.tick(NOW + VIDEO.min_residency_s, freed)
    report, p = ctl.last.portfolio, ctl.last.plan
    assert report is not None and p is not None
    assert report.standby == {"video": "video"}
    assert len(p.hosts_of("video")) == 1 and not p.evictions
    assert not ctl.last.forecasts["video"].direct
    fresh = _controller(tmp_path / "fresh")
    fresh.tick(NOW + VIDEO.min_residency_s, freed)
    assert fresh.last.portfolio is not None and fresh.last.portfolio.standby == {}


def test_standby_never_evicts_and_waits_for_an_idle_host(tmp_path: Path) -> None:
    """Every host is busy with directly named work: nothing stands by, nothing is staged."""
    ctl = _controller(tmp_path)
    for i in range(6):
        ctl.observe_request(
            RequestFeatures(
                at=NOW - 50 + i,
                endpoint="chat",
                requested_model="coder",
                served_model="coder",
                service_time_s=1.0,
                outcome="ok",
            )
        )
    ctl.tick(NOW, [_host("h1", "general"), _host("h2", "coder", active=1)])
    report, p = ctl.last.portfolio, ctl.last.plan
    assert report is not None and p is not None
    assert report.standby == {}
    assert not p.evictions
    assert p.hosts_of("video") == ()


def test_standby_gives_way_when_real_demand_could_use_its_host(tmp_path: Path) -> None:
    """The video model stands by on h2 while the fleet is idle; then named coding traffic
    arrives that wants more hosts than the empty ones. Standby withdraws from h2 and the plan
    no longer keeps video there."""
    fleet = [_host("h1", "general"), _host("h2", "video"), *_hosts(5)[2:]]
    quiet = _controller(tmp_path / "quiet")
    quiet.tick(NOW, fleet)
    assert quiet.last.portfolio is not None and "video" in quiet.last.portfolio.standby.values()
    assert quiet.last.plan is not None and quiet.last.plan.hosts_of("video") == ("h2",)
    busy = _controller(tmp_path / "busy")
    for i in range(600):
        busy.observe_request(
            RequestFeatures(
                at=NOW - 50 + i / 12,
                endpoint="chat",
                requested_model="coder",
                served_model=None,
                outcome="unavailable",
            )
        )
    busy.tick(NOW, fleet)
    report, p = busy.last.portfolio, busy.last.plan
    assert report is not None and p is not None
    assert p.desired["coder"] > 3  # more than the three empty hosts
    assert "video" not in report.standby.values()
    assert p.hosts_of("video") == ()


def test_without_a_portfolio_search_workloads_wait_for_evidence(tmp_path: Path) -> None:
    """The reactive control (no portfolio search installed) keeps idle hosts idle."""
    ctl = _controller(tmp_path, WITHOUT_SEARCH)
    ctl.tick(NOW, _hosts(5))
    report, p = ctl.last.portfolio, ctl.last.plan
    assert report is not None and p is not None
    assert report.standby == {}
    assert {a.model_id for a in p.assignments} == {"general"}


def test_the_planner_places_standby_after_inferred_demand() -> None:
    """One free slot, an inferred (workload) demand and a standby demand: the evidence wins,
    whatever the model ids or sizes; the standby replica is reported short, nothing evicted."""
    hosts = (_host("h1"),)
    inferred = ModelDemand(model_id="video", desired_replicas=1, inferred_rps=0.01)
    standby = ModelDemand(model_id="coder", desired_replicas=1, reasons=(STANDBY_REASON,))
    for demand in ({"video": inferred, "coder": standby},):
        got = plan(
            PlanInputs(now=NOW, profiles=(CODER, VIDEO), hosts=hosts, demand=demand),
            NO_HOOKS,
            reuse=False,
        )
        assert got.hosts_of("video") == ("h1",)
        assert got.hosts_of("coder") == ()
        assert not got.evictions
