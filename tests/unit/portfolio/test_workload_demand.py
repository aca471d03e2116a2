"""Unbound (``auto``) demand is workload demand: it fills spare capacity and never evicts.

Specification, "Proactive observation and portfolio planning": projected (counterfactual)
demand is weaker than direct evidence; direct, pinned and minimum-replica work stays absolute.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from grid_core.controller import Controller
from grid_core.demand.features import RequestFeatures
from grid_core.demand.types import ModelDemand
from grid_core.portfolio.project import project
from grid_core.portfolio.types import WorkloadDemand
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot
from grid_core.system.state_file import FileStateStore
from grid_core.testing import plugins_with

NOW = 1_790_000_000.0
BUILTINS = ("grid_forecast_ewma", "grid_scoring", "grid_victims", "grid_portfolio")


def _controller(tmp: Path, *profiles: ModelProfile) -> Controller:
    store = FileStateStore(tmp / "controller-state.json")
    ctl = Controller(plugins=plugins_with(builtins=BUILTINS), store=store).restore()
    for p in profiles:
        ctl.put_profile(p, NOW)
    return ctl


def _host(*resident: str, capacity_mb: int = 6_000, slots: int = 0) -> HostSnapshot:
    return HostSnapshot(
        host_id="h1",
        capacity_mb=capacity_mb,
        runtimes=("llama.cpp",),
        heartbeat_age_s=1.0,
        max_models=slots,
        residencies=tuple(
            ResidencySnapshot(
                model_id=m,
                memory_mb=4_000,
                state="ready",
                active_requests=0,
                loaded_at=NOW - 7_200,
                last_used_at=NOW - 7_200,
                routable=True,
            )
            for m in resident
        ),
    )


def _auto(at: float, workload: str = "coding") -> RequestFeatures:
    return RequestFeatures(
        at=at, endpoint="chat", requested_model="auto", workload=workload, outcome="unavailable"
    )


def _named(at: float, model: str) -> RequestFeatures:
    return RequestFeatures(
        at=at, endpoint="chat", requested_model=model, served_model=model, service_time_s=1.0
    )


CODER = ModelProfile(
    model_id="coder", memory_mb=4_000, priority=50, workload_scores={"coding": 1.0}
)


@pytest.mark.parametrize(
    "incumbent",
    [
        ModelProfile(model_id="named", memory_mb=4_000),  # direct named demand below
        ModelProfile(model_id="named", memory_mb=4_000, min_replicas=1),  # a baseline
        ModelProfile(model_id="named", memory_mb=4_000, pins=("h1",)),  # a pin
    ],
    ids=["direct", "baseline", "pinned"],
)
def test_an_auto_burst_preempts_nothing(incumbent: ModelProfile, tmp_path: Path) -> None:
    """200 ``auto`` coding requests for a higher-priority coder never evict the resident
    model, whatever protects it (even nothing): the coder waits for spare capacity."""
    ctl = _controller(tmp_path, incumbent, CODER)
    host = _host("named")
    request_named = incumbent.min_replicas == 0 and not incumbent.pins
    for tick in range(6):
        now = NOW + 60.0 * tick
        for i in range(40):
            ctl.observe_request(_auto(now + i * 0.5))
        if request_named:
            ctl.observe_request(_named(now, "named"))
        ctl.set_mode("automatic", now)
        result = ctl.tick(now + 30, [host])
        assert result.plan.evictions == ()
        assert result.plan.hosts_of("coder") == ()
        assert not [a for a in ctl.book.active() if a.model_id == "named"]
    coder = ctl.last.forecasts["coder"]
    assert coder.inferred_rps > 0 and not coder.direct
    assert ctl.last.portfolio is not None
    row = next(r for r in ctl.last.portfolio.admissions if r.workload == "coding")
    assert row.model_id == "coder" and row.state in ("capacity-contended", "blocked-by-residency")


def test_direct_demand_for_the_same_model_keeps_its_authority_but_no_more(
    tmp_path: Path,
) -> None:
    """Named traffic for the coder may preempt a lower-priority idle model; the workload's
    extra replicas ride along as held replicas that never evict."""
    low = ModelProfile(model_id="low", memory_mb=4_000, priority=0)
    ctl = _controller(tmp_path, low, CODER)
    host = _host("low")
    ctl.set_mode("automatic", NOW)
    for i in range(30):
        ctl.observe_request(_named(NOW + i, "coder"))
        ctl.observe_request(_auto(NOW + i))
    result = ctl.tick(NOW + 31, [host])
    coder = ctl.last.forecasts["coder"]
    assert coder.direct and coder.inferred_rps > 0
    assert coder.held_replicas >= 0
    assert [e.model_id for e in result.plan.evictions] == ["low"]


def test_auto_demand_fills_spare_capacity(tmp_path: Path) -> None:
    """With room on the host, the workload's best model gets a replica (a canary)."""
    ctl = _controller(tmp_path, ModelProfile(model_id="named", memory_mb=4_000), CODER)
    host = _host("named", capacity_mb=16_000)
    for i in range(5):
        ctl.observe_request(_auto(NOW + i))
    result = ctl.tick(NOW + 10, [host])
    assert result.plan.hosts_of("coder") == ("h1",)
    assert result.plan.evictions == ()
    row = next(r for r in ctl.last.portfolio.admissions if r.workload == "coding")  # type: ignore[union-attr]
    assert row.state == "planned" and row.planned == 1


def test_an_undersupplied_row_says_why_the_missing_replicas_wait(tmp_path: Path) -> None:
    """A burst wants three coder replicas; one is ready on its own host and the only other
    host holds a model in direct use: the row names the plan's reason for the two missing
    replicas (memory), and nothing is evicted for them."""
    import msgspec

    coder = msgspec.structs.replace(CODER, max_replicas=3)
    ctl = _controller(tmp_path, ModelProfile(model_id="named", memory_mb=4_000), coder)
    hosts = [_host("named"), msgspec.structs.replace(_host("coder"), host_id="h2")]
    ctl.set_mode("automatic", NOW)
    for tick in range(3):
        now = NOW + 60.0 * tick
        for i in range(200):
            ctl.observe_request(_auto(now + i * 0.1))
        ctl.observe_request(_named(now, "named"))
        result = ctl.tick(now + 30, hosts)
        assert result.plan.evictions == ()
    assert ctl.last.portfolio is not None
    [row] = ctl.last.portfolio.admissions
    assert (row.state, row.desired, row.ready, row.missing) == ("undersupplied", 3, 1, 2)
    assert row.reason.startswith("1 of 3 replicas of coder ready; ")
    assert "2 of 3 desired replica(s) unplaced" in row.reason and "memory" in row.reason


def test_below_the_admission_gate_nothing_is_planned(tmp_path: Path) -> None:
    """Two short requests are below the gate (3 observations or 1.5 units): no canary (and
    one host is all the spare-capacity reserve a fleet has, so no standby either)."""
    ctl = _controller(tmp_path, CODER)
    host = _host(capacity_mb=16_000)
    for i in range(2):
        ctl.observe_request(_auto(NOW + i))
    result = ctl.tick(NOW + 10, [host])
    assert result.plan.hosts_of("coder") == ()
    report = ctl.last.portfolio
    assert report is not None and report.mapping == {} and report.standby == {}
    row = report.admissions[0]
    assert row.state == "awaiting-plan" and "2/3 observations" in row.reason


def test_allocator_status_renders_the_admission_rows(tmp_path: Path) -> None:
    """``grid allocator status`` shows one row per active workload, the gate and the
    candidates; ``--json`` carries the same report."""
    import msgspec

    from grid_server.cli_allocator import render_status

    ctl = _controller(tmp_path, ModelProfile(model_id="named", memory_mb=4_000), CODER)
    for i in range(5):
        ctl.observe_request(_auto(NOW + i))
    ctl.observe_request(_auto(NOW, workload="research"))
    ctl.tick(NOW + 10, [_host("named", capacity_mb=16_000)])
    doc = msgspec.to_builtins(ctl.status(NOW + 10, detail=True))
    assert [r["workload"] for r in doc["portfolio"]["admissions"]] == ["coding", "research"]
    text = render_status({"mode": "recommend", "server": {}, "controller": doc})
    assert "Workload admission" in text and "Portfolio candidates" in text
    assert "coding" in text and "planned" in text and "awaiting-plan" in text
    assert "gate: 3 requests or 1.5 units" in text
    assert "standby on idle capacity:" in text


def test_a_scale_down_hold_does_not_absorb_the_first_replica_of_a_workloads_model() -> None:
    """A model that serves nowhere now (its replica was lost or stranded) may still carry the
    scale-down hold its older traffic left; the workload mapped onto it must still be able to
    place its first replica, while the rest of the hold stays hysteresis only."""
    video = ModelProfile(
        model_id="video", memory_mb=1_000, max_replicas=8, expected_service_time_s=90.0
    )
    hold = ModelDemand(model_id="video", desired_replicas=4, held_replicas=4, ready_replicas=0)
    wl = {"video": WorkloadDemand(workload="video", request_rate_rps=0.002, admitted=True)}

    def placeable(d: ModelDemand) -> int:
        out = project({"video": d}, wl, {"video": "video"}, {"video": video}, 0.2)["video"]
        assert out.desired_replicas == 4 and not out.direct
        return out.desired_replicas - out.held_replicas

    assert placeable(hold) == 1
    # Served somewhere already: the hold stays whole (it keeps replicas, it asks for none).
    assert placeable(msgspec.structs.replace(hold, ready_replicas=1)) == 0


def test_a_replica_on_a_throttled_host_it_cannot_finish_jobs_on_is_not_ready(
    tmp_path: Path,
) -> None:
    """The coding model's only replica sits on a throttled host where one of its two-minute
    requests would outlast the protection grace. The planner places a replacement on the
    free host; the admission row must say so (planned, 0 ready) and name the throttled
    replica, not report the workload as ready."""
    coder = msgspec.structs.replace(CODER, expected_service_time_s=120.0)
    ctl = _controller(tmp_path, coder)
    hot = msgspec.structs.replace(_host("coder"), state="throttled", throttle_fraction=0.5)
    free = msgspec.structs.replace(_host(), host_id="h2")
    for i in range(5):
        ctl.observe_request(_auto(NOW + i))
    result = ctl.tick(NOW + 10, [hot, free])
    assert result.plan.hosts_of("coder") == ("h2",)
    assert ctl.last.portfolio is not None
    row = next(r for r in ctl.last.portfolio.admissions if r.workload == "coding")
    assert (row.state, row.ready, row.planned) == ("planned", 0, 1)
    assert "not counted as ready: coder on h1 (throttled" in row.reason
