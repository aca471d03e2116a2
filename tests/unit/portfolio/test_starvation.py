"""Ending whole-workload starvation: an excess replica gives way, every floor is kept.

Specification, "Proactive observation and portfolio planning": when a clean structural plan
proves the fleet can host one preferred model per active workload, an excess replica may be
reclaimed so a workload is not starved behind full hosts; the controller takes the first
ranked path that keeps the victim's ready-replica floor, and pins, baselines and directly
named demand stay absolute fences.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from grid_core.controller import Controller
from grid_core.demand.features import RequestFeatures
from grid_core.demand.series import Forecast
from grid_core.planner.types import PlannerPolicy
from grid_core.portfolio.feasibility import Fit
from grid_core.portfolio.gate import admit, workload_demand
from grid_core.portfolio.types import AdmissionThresholds, Replacement
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot
from grid_core.system.state_file import FileStateStore
from grid_core.testing import plugins_with

NOW = 1_790_000_000.0
BUILTINS = ("grid_forecast_ewma", "grid_scoring", "grid_victims", "grid_portfolio")
HOSTS = ("h1", "h2")


def _image(min_replicas: int = 0) -> ModelProfile:
    return ModelProfile(
        model_id="image",
        memory_mb=1_000,
        min_replicas=min_replicas,
        max_replicas=4,
        workload_scores={"image": 1.0},
    )


VIDEO = ModelProfile(
    model_id="video", memory_mb=1_000, expected_service_time_s=90.0, workload_scores={"video": 1.0}
)


def _video_over_image(**kw: object) -> Replacement:
    """Video replacing image on h1 (a 1.5x path unless ``rule`` says otherwise)."""
    base: dict[str, object] = {
        "beneficiary": "video",
        "workload": "video",
        "host_id": "h1",
        "victims": ("image",),
        "pressure": 3.0,
        "victim_pressure": 1.0,
    }
    return Replacement(**{**base, **kw})  # type: ignore[arg-type]


def _hosts(active: int = 0) -> list[HostSnapshot]:
    """Two one-slot hosts, each holding a ready replica of ``image``."""
    return [
        HostSnapshot(
            host_id=h,
            capacity_mb=8_000,
            runtimes=("llama.cpp",),
            heartbeat_age_s=1.0,
            max_models=1,
            residencies=(
                ResidencySnapshot(
                    model_id="image",
                    memory_mb=1_000,
                    state="ready",
                    active_requests=active,
                    loaded_at=NOW - 7_200,
                    last_used_at=NOW - 10,
                    routable=True,
                ),
            ),
        )
        for h in HOSTS
    ]


def _auto(at: float, workload: str, served: str | None) -> RequestFeatures:
    return RequestFeatures(
        at=at,
        endpoint="chat",
        requested_model="auto",
        workload=workload,
        served_model=served,
        service_time_s=1.0 if served else None,
        outcome="ok" if served else "unavailable",
    )


def _tick(tmp: Path, image: ModelProfile, image_requests: int, active: int = 0) -> Controller:
    store = FileStateStore(tmp / "controller-state.json")
    ctl = Controller(plugins=plugins_with(builtins=BUILTINS), store=store).restore()
    for p in (image, VIDEO):
        ctl.put_profile(p, NOW)
    for i in range(image_requests):
        ctl.observe_request(_auto(NOW + 240 + 50 * i / image_requests, "image", "image"))
    for i in range(3):  # three video jobs nothing could serve
        ctl.observe_request(_auto(NOW + 250 + 10 * i, "video", None))
    ctl.tick(NOW + 300, _hosts(active))
    return ctl


def test_a_starved_workload_takes_an_excess_replica_and_one_copy_stays(tmp_path: Path) -> None:
    """Both hosts hold the image model; the video workload has nowhere to go. One image
    replica (busy with in-flight work, which the drain finishes) gives way; the other stays
    and the image workload keeps its model."""
    ctl = _tick(tmp_path, _image(), image_requests=3, active=1)
    report = ctl.last.portfolio
    assert report is not None and report.replacing is not None
    rep = report.replacing
    assert (rep.rule, rep.beneficiary, rep.victims) == ("starvation", "video", ("image",))
    assert report.mapping == {"image": "image", "video": "video"}
    plan = ctl.last.plan
    assert plan is not None
    assert plan.hosts_of("image") == tuple(h for h in HOSTS if h != rep.host_id)
    rows = {r.workload: r for r in report.admissions}
    assert rows["video"].state == "blocked-by-residency"
    assert rows["image"].state == "ready"


def test_under_the_structural_proof_only_one_copy_of_a_busy_model_is_protected(
    tmp_path: Path,
) -> None:
    """Image traffic that would keep both replicas busy (about 5 rps of one-second jobs,
    more pressure than the 1.5x rule lets video outbid) still gives one replica up: once the
    clean plan proves the fleet holds one model per active workload, one copy of each active
    model is the floor and the rest may end video's starvation. The plan keeps image on the
    other host; the replica on the path host is shown leaving, not kept."""
    ctl = _tick(tmp_path, _image(), image_requests=300)
    report = ctl.last.portfolio
    assert report is not None and report.replacing is not None
    rep = report.replacing
    assert (rep.rule, rep.beneficiary, rep.victims) == ("starvation", "video", ("image",))
    plan = ctl.last.plan
    assert plan is not None
    assert plan.hosts_of("image") == tuple(h for h in HOSTS if h != rep.host_id)


def test_the_replica_on_the_path_host_is_the_one_that_leaves(tmp_path: Path) -> None:
    """Only the first host can hold video (the second lacks its runtime): the image replica
    there gives way even though the planner, left alone, would keep that one (it ranks
    equal incumbents by host id) and drop the replica on the second host, which frees
    nothing video can use."""
    video = msgspec.structs.replace(VIDEO, runtimes=("comfyui",))
    store = FileStateStore(tmp_path / "controller-state.json")
    ctl = Controller(plugins=plugins_with(builtins=BUILTINS), store=store).restore()
    for p in (_image(), video):
        ctl.put_profile(p, NOW)
    for i in range(3):
        ctl.observe_request(_auto(NOW + 240 + 10 * i, "image", "image"))
        ctl.observe_request(_auto(NOW + 250 + 10 * i, "video", None))
    hosts = _hosts(active=1)
    hosts[0] = msgspec.structs.replace(hosts[0], runtimes=("llama.cpp", "comfyui"))
    ctl.tick(NOW + 300, hosts)
    report = ctl.last.portfolio
    assert report is not None and report.replacing is not None
    assert (report.replacing.host_id, report.replacing.victims) == ("h1", ("image",))
    plan = ctl.last.plan
    assert plan is not None and plan.hosts_of("image") == ("h2",)


def test_a_baseline_is_never_reclaimed_for_workload_demand(tmp_path: Path) -> None:
    """A configured baseline (minimum replicas) is an absolute fence for speculative demand,
    even above its minimum."""
    ctl = _tick(tmp_path, _image(min_replicas=1), image_requests=3)
    report = ctl.last.portfolio
    assert report is not None and report.replacing is None
    assert ctl.last.plan is not None and ctl.last.plan.hosts_of("image") == HOSTS


def test_the_authorization_is_carried_until_the_beneficiary_is_ready(tmp_path: Path) -> None:
    """Next tick the victim has been drained and unloaded: the freed host goes to the starved
    workload's model, not back to the victim's leftover demand."""
    ctl = _tick(tmp_path, _image(), image_requests=3, active=1)
    first = ctl.last.portfolio
    assert first is not None and first.replacing is not None
    freed = first.replacing.host_id
    hosts = [
        h
        if h.host_id != freed
        else HostSnapshot(
            host_id=h.host_id,
            capacity_mb=h.capacity_mb,
            runtimes=h.runtimes,
            heartbeat_age_s=1.0,
            max_models=1,
        )
        for h in _hosts(active=1)
    ]
    ctl.tick(NOW + 360, hosts)
    plan = ctl.last.plan
    assert plan is not None and plan.hosts_of("video") == (freed,)
    assert freed not in plan.hosts_of("image") and len(plan.hosts_of("image")) == 1


def test_admission_holds_while_the_requests_are_remembered() -> None:
    """One minute-long video job crosses the concurrency gate on arrival; a minute later its
    forecast has decayed below the gate, yet it stays admitted (held, one replica) while the
    job is within the admission memory, and leaves once nothing is remembered."""
    gate = AdmissionThresholds()
    first = workload_demand("video", Forecast(rate_rps=0.0, queued=2.0), 1, (VIDEO,), gate)
    assert first.admitted and first.admission == "concurrency"
    later = workload_demand("video", Forecast(rate_rps=0.0), 1, (VIDEO,), gate)
    assert not later.admitted
    fit = Fit((VIDEO,), tuple(_hosts()), PlannerPolicy(), {})
    held = admit({"video": later}, fit, {"video": first})["video"]
    assert held.admitted and held.admission == "held" and held.canary_cap
    forgotten = workload_demand("video", Forecast(rate_rps=0.0), 0, (VIDEO,), gate)
    assert not admit({"video": forgotten}, fit, {"video": held})["video"].admitted


def test_a_replica_in_a_silent_hosts_last_report_neither_ends_nor_floors_a_replacement() -> None:
    """A host that stopped heartbeating still lists what died with it. The beneficiary
    "ready" there has not arrived (the replacement stays carried), and a victim's copy there
    is no floor (a starvation path that relied on it is dropped)."""
    from grid_core.portfolio.replace import carried

    hosts = _hosts()
    silent = msgspec.structs.replace(
        hosts[1],
        residencies=(msgspec.structs.replace(hosts[1].residencies[0], model_id="video"),),
    )
    fleet = (hosts[0], silent)
    pressure = _video_over_image()
    mapping = {"video": "video"}
    assert carried(pressure, mapping, fleet, frozenset({"h2"})) == pressure
    assert carried(pressure, mapping, fleet) is None  # a live host: video has arrived
    starving = msgspec.structs.replace(pressure, rule="starvation")
    image_on_h2 = (hosts[0], hosts[1])
    assert carried(starving, mapping, image_on_h2) == starving
    assert carried(starving, mapping, image_on_h2, frozenset({"h2"})) is None


def test_a_replacement_ends_when_another_model_took_its_host() -> None:
    """The victim left the path host, but other demand was placed there before the starved
    model: the authorization has nothing left to hold, so it is not carried (it would
    otherwise stand for as long as that model stays, blocking every other path)."""
    from grid_core.portfolio.replace import carried

    hosts = _hosts()
    rep = _video_over_image(rule="starvation")
    other = msgspec.structs.replace(
        hosts[0],
        residencies=(msgspec.structs.replace(hosts[0].residencies[0], model_id="general"),),
    )
    emptied = msgspec.structs.replace(hosts[0], residencies=())
    mapping = {"video": "video"}
    assert carried(rep, mapping, (emptied, hosts[1])) == rep  # freed, video not there yet
    assert carried(rep, mapping, (other, hosts[1])) is None
