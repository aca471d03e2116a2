"""Evidence that decides, the admission gate and the bounded joint search.

Specification, "Proactive observation and portfolio planning".
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from grid_core.controller import Controller
from grid_core.demand.features import RequestFeatures
from grid_core.demand.series import Forecast
from grid_core.portfolio.evidence import OPTIMISM_BONUS, OUTCOME_HALF_LIFE_S, OutcomeBook
from grid_core.portfolio.gate import workload_demand
from grid_core.portfolio.types import MAX_PORTFOLIOS, AdmissionThresholds
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot
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


def _host(host_id: str = "h1", capacity_mb: int = 64_000, slots: int = 0) -> HostSnapshot:
    return HostSnapshot(
        host_id=host_id,
        capacity_mb=capacity_mb,
        runtimes=("llama.cpp",),
        heartbeat_age_s=1.0,
        max_models=slots,
    )


def _auto(at: float, workload: str, served: str | None = None, ok: bool = True) -> RequestFeatures:
    return RequestFeatures(
        at=at,
        endpoint="chat",
        requested_model="auto",
        workload=workload,
        served_model=served,
        service_time_s=1.0 if served else None,
        outcome=("ok" if ok else "error") if served else "unavailable",
    )


def test_outcome_confidence_reaches_full_weight_at_twenty_and_halves_weekly() -> None:
    book = OutcomeBook()
    for i in range(20):
        book.record(
            model_id="m", workload="coding", sha="a" * 64, ok=True, service_s=1.0, now=NOW + i
        )
    success, conf = book.view("m", "coding", "a" * 64, NOW + 20)
    assert success == 1.0 and conf > 0.99
    _, week_later = book.view("m", "coding", "a" * 64, NOW + 20 + OUTCOME_HALF_LIFE_S)
    assert 0.49 < week_later < 0.51
    # A replacement artifact starts uncertain: the old revision's evidence does not carry.
    assert book.view("m", "coding", "b" * 64, NOW + 20) == (1.0, 0.0)


def test_measured_failures_move_a_workload_to_the_peer(tmp_path: Path) -> None:
    """Two equally suitable coders: the one whose ``auto`` completions keep failing loses the
    workload; its failures never become direct demand for it."""
    a = ModelProfile(model_id="coder-a", memory_mb=1_000, workload_scores={"coding": 0.9})
    b = ModelProfile(model_id="coder-b", memory_mb=1_000, workload_scores={"coding": 0.9})
    ctl = _controller(tmp_path, a, b)
    for i in range(25):
        ctl.observe_request(_auto(NOW + i, "coding", served="coder-a", ok=False))
    ctl.tick(NOW + 30, [_host()])
    report = ctl.last.portfolio
    assert report is not None and report.mapping == {"coding": "coder-b"}
    assert ctl.last.forecasts["coder-a"].request_rate_rps == 0  # never direct demand
    row = next(c for c in report.candidates if c.model_id == "coder-a")
    assert row.outcome == 0.0 and row.outcome_confidence > 0.99


def test_labelled_quality_decides_between_suitable_models(tmp_path: Path) -> None:
    """Eight fresh evaluations (full quality weight) put a lower-configured model ahead."""
    a = ModelProfile(model_id="coder-a", memory_mb=1_000, workload_scores={"coding": 0.9})
    b = ModelProfile(model_id="coder-b", memory_mb=1_000, workload_scores={"coding": 0.7})
    ctl = _controller(tmp_path, a, b)
    for _ in range(8):
        ctl.record_evaluation("coder-a", "coding", None, 0.2, NOW)
        ctl.record_evaluation("coder-b", "coding", None, 0.95, NOW)
    for i in range(5):
        ctl.observe_request(_auto(NOW + i, "coding"))
    ctl.tick(NOW + 10, [_host()])
    assert ctl.last.portfolio is not None
    assert ctl.last.portfolio.mapping == {"coding": "coder-b"}


def test_without_evidence_the_bonus_is_six_points_and_one_model_explores(tmp_path: Path) -> None:
    """Fresh candidates carry the six-point optimism bonus; the exploitation choice (by
    configured suitability) wins when the bonus does not change the order."""
    a = ModelProfile(model_id="coder-a", memory_mb=1_000, workload_scores={"coding": 0.9})
    b = ModelProfile(model_id="coder-b", memory_mb=1_000, workload_scores={"coding": 0.5})
    ctl = _controller(tmp_path, a, b)
    for i in range(5):
        ctl.observe_request(_auto(NOW + i, "coding"))
    ctl.tick(NOW + 10, [_host()])
    report = ctl.last.portfolio
    assert report is not None and report.mapping == {"coding": "coder-a"}
    assert {c.bonus for c in report.candidates} == {OPTIMISM_BONUS}
    assert report.evaluated <= MAX_PORTFOLIOS


def test_the_gate_admits_one_long_job_but_not_one_short_request() -> None:
    """1.5 offered-concurrency units admit a queued minute-long video job at once; one short
    text request stays below the gate (3 observations)."""
    gate = AdmissionThresholds()
    video = ModelProfile(
        model_id="video",
        memory_mb=1_000,
        expected_service_time_s=90.0,
        workload_scores={"video": 1.0},
    )
    chat = ModelProfile(model_id="chat", memory_mb=1_000, workload_scores={"coding": 1.0})
    long_job = workload_demand("video", Forecast(rate_rps=1 / 60, queued=1.0), 1, (video,), gate)
    assert long_job.admitted and long_job.admission == "concurrency"
    short = workload_demand("coding", Forecast(rate_rps=1 / 600), 1, (chat,), gate)
    assert not short.admitted and short.admission == "below_gate"
    three = workload_demand("coding", Forecast(rate_rps=1 / 600), 3, (chat,), gate)
    assert three.admitted and three.admission == "observations"


def test_thresholds_are_persisted_and_sparse_arrivals_count_for_an_hour(tmp_path: Path) -> None:
    """One request every seven minutes is an ongoing need: the third within the hour admits
    it (the forecast window alone never shows three); a restart keeps both gate and memory."""
    coder = ModelProfile(model_id="coder", memory_mb=1_000, workload_scores={"coding": 1.0})
    ctl = _controller(tmp_path, coder)
    for k in range(3):
        ctl.observe_request(_auto(NOW + 420.0 * k, "coding"))
        ctl.tick(NOW + 420.0 * k + 1, [_host()])
    assert ctl.last.portfolio is not None
    row = ctl.last.portfolio.admissions[0]
    assert row.observations == 3 and row.state == "planned"
    ctl.put_profile(coder, NOW + 900)  # an operator change persists the document
    again = _controller(tmp_path)
    assert again.portfolio.thresholds == AdmissionThresholds()
    again.tick(NOW + 901, [_host()])
    assert again.last.portfolio is not None
    assert again.last.portfolio.admissions[0].observations == 3


def _resident(model: str) -> HostSnapshot:
    from grid_core.snapshot import ResidencySnapshot

    return HostSnapshot(
        host_id="h1",
        capacity_mb=64_000,
        runtimes=("llama.cpp",),
        heartbeat_age_s=1.0,
        max_models=1,
        residencies=(
            ResidencySnapshot(
                model_id=model,
                memory_mb=1_000,
                state="ready",
                active_requests=0,
                loaded_at=NOW - 7_200,
                last_used_at=NOW - 7_200,
                routable=True,
            ),
        ),
    )


def _replacement_case(tmp_path: Path, video_jobs: int) -> Controller:
    image = ModelProfile(model_id="image", memory_mb=1_000, workload_scores={"image": 1.0})
    video = ModelProfile(
        model_id="video",
        memory_mb=1_000,
        expected_service_time_s=90.0,
        workload_scores={"video": 1.0},
    )
    ctl = _controller(tmp_path, image, video)
    for i in range(3):
        ctl.observe_request(_auto(NOW + 100 * i, "image", served="image"))
    for i in range(video_jobs):
        ctl.observe_request(_auto(NOW + 250 + 10 * i, "video"))
    ctl.tick(NOW + 300, [_resident("image")])
    return ctl


def test_a_mature_workload_with_1_5x_pressure_replaces_an_idle_speculative_canary(
    tmp_path: Path,
) -> None:
    """One model slot, held by an idle image canary: a video workload with far more
    device-time pressure takes it through one planner-proved path (drain first)."""
    ctl = _replacement_case(tmp_path, video_jobs=5)
    report = ctl.last.portfolio
    assert report is not None and report.replacing is not None
    assert (report.replacing.beneficiary, report.replacing.victims) == ("video", ("image",))
    assert ctl.last.plan is not None and ctl.last.plan.hosts_of("image") == ()
    rows = {r.workload: r for r in report.admissions}
    assert rows["video"].state == "blocked-by-residency"
    assert rows["image"].state == "deferred" and "gives way" in rows["image"].reason


def _second_tick(ctl: Controller, state: str, active: int) -> None:
    """A minute later, with the image canary in ``state`` serving ``active`` requests."""
    host = _resident("image")
    res = msgspec.structs.replace(host.residencies[0], state=state, active_requests=active)
    ctl.tick(NOW + 360, [msgspec.structs.replace(host, residencies=(res,))])


def test_a_replacement_in_progress_is_carried_to_the_next_tick(tmp_path: Path) -> None:
    """The path chosen last tick is finished: a minute later the image canary is draining
    (a fresh search finds no idle resident to replace any more), yet the replacement stands
    and video keeps waiting for that host."""
    ctl = _replacement_case(tmp_path, video_jobs=5)
    first = ctl.last.portfolio
    assert first is not None and first.replacing is not None
    _second_tick(ctl, "draining", 0)
    report = ctl.last.portfolio
    assert report is not None and report.replacing == first.replacing
    rows = {r.workload: r for r in report.admissions}
    assert rows["video"].state == "blocked-by-residency"


def test_a_carried_replacement_ends_when_its_victim_takes_traffic_again(tmp_path: Path) -> None:
    """Speculative demand never evicts an active canary: when the image canary serves
    requests again before its drain began, the replacement is dropped and image stays."""
    ctl = _replacement_case(tmp_path, video_jobs=5)
    assert ctl.last.portfolio is not None and ctl.last.portfolio.replacing is not None
    _second_tick(ctl, "ready", 1)
    report = ctl.last.portfolio
    assert report is not None and report.replacing is None
    assert ctl.last.plan is not None and ctl.last.plan.hosts_of("image") == ("h1",)


def test_an_incumbent_canary_stays_without_1_5x_pressure(tmp_path: Path) -> None:
    """Below the ratio (or with a weak-evidence beneficiary) nothing is replaced."""
    ctl = _replacement_case(tmp_path, video_jobs=0)
    report = ctl.last.portfolio
    assert report is not None and report.replacing is None
    assert ctl.last.plan is not None and ctl.last.plan.hosts_of("image") == ("h1",)


def test_a_sparse_workload_keeps_its_pressure_between_requests() -> None:
    """Between two video jobs the bucketed forecast decays to zero; the remembered arrivals
    (six in the hour) keep the workload's pressure at 6/3600 x 90 s = 0.15 units."""
    video = ModelProfile(
        model_id="video",
        memory_mb=1_000,
        expected_service_time_s=90.0,
        workload_scores={"video": 1.0},
    )
    d = workload_demand("video", Forecast(rate_rps=0.0), 6, (video,), AdmissionThresholds())
    assert abs(d.offered_concurrency - 0.15) < 1e-9 and d.admitted


def test_a_carried_replacement_ends_when_its_beneficiary_fits_elsewhere(tmp_path: Path) -> None:
    """A path only holds while the beneficiary needs that host: once another host has room
    (here a second host joins empty before the canary's drain began), video goes there and
    the idle image canary is not drained for nothing."""
    ctl = _replacement_case(tmp_path, video_jobs=5)
    assert ctl.last.portfolio is not None and ctl.last.portfolio.replacing is not None
    spare = msgspec.structs.replace(_resident("image"), host_id="h2", residencies=())
    ctl.tick(NOW + 360, [_resident("image"), spare])
    report = ctl.last.portfolio
    assert report is not None and report.replacing is None
    assert ctl.last.plan is not None
    assert ctl.last.plan.hosts_of("image") == ("h1",)
    assert ctl.last.plan.hosts_of("video") == ("h2",)
