"""Learned lifecycle timings: acknowledged durations steer placement and startup estimates."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simfleet import PLANNER_PLUGINS

from grid_core.controller import Controller
from grid_core.demand.desired import startup_horizon_s, startup_path_s
from grid_core.planner.types import Plan, PlanInputs
from grid_core.profile import ModelProfile
from grid_core.reconcile.actions import Action
from grid_core.reconcile.timings import (
    MAX_TIMING_ENTRIES,
    TIMING_EXPIRY_S,
    TIMING_WINDOW,
    TimingBook,
)
from grid_core.snapshot import HostSnapshot, ModelPerformance
from grid_core.store import MemoryStore
from grid_core.testing import plugins_with
from grid_core.wire import Acknowledgement
from grid_server.store import FileStateStore

NOW = 1_800_000_000.0
SHA_A = "a" * 64
SHA_B = "b" * 64
SOURCE = "hf://grid/models/m.gguf"
DAY = 86_400.0


def profile(sha: str | None = SHA_A, source: str | None = None, **kw: object) -> ModelProfile:
    base: dict[str, object] = {
        "model_id": "m",
        "memory_mb": 4000,
        "min_replicas": 1,
        "max_replicas": 1,
        "load_estimate_s": 30.0,
        "warm_estimate_s": 10.0,
    }
    base.update(kw)
    if source is not None:
        base["artifact_source"] = source
        base["artifact_size_mb"] = 3000
    return ModelProfile(artifact_sha256=sha, **base)  # type: ignore[arg-type]


def host(host_id: str, **kw: object) -> HostSnapshot:
    return HostSnapshot(
        host_id=host_id,
        capacity_mb=16_000,
        heartbeat_age_s=0.0,
        runtimes=("llama.cpp",),
        backends=("metal",),
        actuator_capabilities=("load", "warm", "drain", "unload"),
        **kw,
    )  # type: ignore[arg-type]


class Harness:
    """A real controller; receipts go through ``Controller.acknowledge``."""

    def __init__(self, store: object | None = None, prof: ModelProfile | None = None) -> None:
        self.seen: list[PlanInputs] = []
        self.plugins = plugins_with(builtins=PLANNER_PLUGINS)
        self.ctl = Controller(
            plugins=self.plugins,
            store=store or MemoryStore(),  # type: ignore
            plan_fn=self._plan,
        ).restore()
        if prof is not None:
            self.ctl.put_profile(prof, NOW)
        self.n = 0

    def _plan(self, inputs: PlanInputs, plugins: object) -> Plan:
        from grid_core.planner import plan

        self.seen.append(inputs)
        return plan(inputs, plugins)

    def report(
        self,
        host_id: str,
        kind: str,
        seconds: float | None,
        *,
        fetched: bool = False,
        status: str = "succeeded",
        sha: str | None = SHA_A,
        now: float = NOW,
    ) -> str:
        self.n += 1
        aid = f"{kind}-{host_id}-{self.n:04d}"
        assert self.ctl.book.add(
            Action(
                action_id=aid,
                kind=kind,
                host_id=host_id,  # type: ignore
                model_id="m",
                artifact_sha256=sha,
                created_at=now,
            )
        )
        ack = Acknowledgement(
            action_id=aid,
            status=status,
            duration_seconds=seconds,  # type: ignore
            artifact_fetched=fetched,
        )
        out = self.ctl.acknowledge(host_id, [ack], now)
        assert out == ["applied"]
        return aid

    def perf(self, host_id: str, now: float = NOW) -> ModelPerformance | None:
        self.ctl.tick(now, [host("h1"), host("h2")])
        hosts = {h.host_id: h for h in self.seen[-1].hosts}
        return hosts[host_id].performance.get("m")

    def placed(self, hosts: list[HostSnapshot], now: float = NOW) -> tuple[str, ...]:
        return self.ctl.tick(now, hosts).plan.hosts_of("m")


def test_eight_sample_ewma_becomes_authoritative_after_four_samples() -> None:
    h = Harness(prof=profile())
    assert h.perf("h1") is None  # nothing learned: the profile priors apply
    for _ in range(2):
        h.report("h1", "warm", 30.0)
    perf = h.perf("h1")
    assert perf is not None and perf.warm_s == pytest.approx(20.0)  # half learned, half prior
    assert perf.load_s is None and perf.fetch_s is None
    for _ in range(2):
        h.report("h1", "warm", 30.0)
    assert h.perf("h1").warm_s == pytest.approx(30.0)  # type: ignore[union-attr]
    for _ in range(4):
        h.report("h1", "warm", 30.0)
    h.report("h1", "warm", 110.0)  # one outlier moves a full window by an eighth
    assert h.perf("h1").warm_s == pytest.approx(30.0 + 80.0 / TIMING_WINDOW)  # type: ignore
    assert h.perf("h2") is None  # another host keeps the conservative fallback


def test_loads_are_split_into_fetch_and_verify_only() -> None:
    h = Harness(prof=profile())
    for _ in range(4):
        h.report("h1", "load", 200.0, fetched=True)
        h.report("h1", "load", 4.0, fetched=False)
        h.report("h1", "warm", 12.0, fetched=True)  # not a load: never a fetch sample
    perf = h.perf("h1")
    assert perf is not None
    assert (perf.fetch_s, perf.load_s, perf.warm_s) == pytest.approx((200.0, 4.0, 12.0))


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, -1.0, 3600.5])
def test_invalid_reports_are_ignored(bad: float | None) -> None:
    h = Harness(prof=profile())
    h.report("h1", "warm", bad)
    assert len(h.ctl.timings) == 0
    assert h.perf("h1") is None


def test_failed_duplicate_and_non_lifecycle_receipts_teach_nothing() -> None:
    h = Harness(prof=profile())
    h.report("h1", "warm", 500.0, status="failed")
    h.report("h1", "drain", 5.0)
    assert len(h.ctl.timings) == 0
    aid = h.report("h1", "warm", 40.0)
    dup = Acknowledgement(action_id=aid, status="succeeded", duration_seconds=40.0)
    assert h.ctl.acknowledge("h1", [dup, dup], NOW) == ["duplicate", "duplicate"]
    entry = h.ctl.timings.get("h1", "m", SHA_A, "warm")
    assert entry is not None and entry.samples == 1


def test_a_checksum_change_starts_from_the_priors() -> None:
    h = Harness(prof=profile())
    for _ in range(4):
        h.report("h1", "warm", 300.0)
    assert h.perf("h1").warm_s == pytest.approx(300.0)  # type: ignore[union-attr]
    h.ctl.put_profile(profile(sha=SHA_B), NOW)
    assert h.perf("h1") is None
    h.report("h1", "warm", 50.0, sha=SHA_A)  # a late receipt for the previous revision
    assert h.perf("h1") is None
    h.report("h1", "warm", 50.0, sha=SHA_B)
    assert h.perf("h1").warm_s == pytest.approx(0.25 * 50.0 + 0.75 * 10.0)  # type: ignore


def test_samples_expire_after_thirty_days() -> None:
    h = Harness(prof=profile())
    for _ in range(4):
        h.report("h1", "warm", 300.0)
    assert h.perf("h1", now=NOW + TIMING_EXPIRY_S - 1).warm_s == pytest.approx(300.0)  # type: ignore
    later = NOW + TIMING_EXPIRY_S + 1
    assert h.perf("h1", now=later) is None
    h.report("h1", "warm", 20.0, now=later)  # relearning starts over, not from the old mean
    entry = h.ctl.timings.get("h1", "m", SHA_A, "warm")
    assert entry is not None and entry.samples == 1 and entry.mean_s == 20.0


def test_learned_timings_survive_a_restart_and_show_in_status(tmp_path: Path) -> None:
    path = tmp_path / "state" / "controller.json"
    h = Harness(store=FileStateStore(path), prof=profile())
    for _ in range(5):
        h.report("h1", "load", 90.0, fetched=True)
    again = Harness(store=FileStateStore(path))
    entry = again.ctl.timings.get("h1", "m", SHA_A, "fetch")
    assert entry is not None and entry.samples == 5 and entry.mean_s == pytest.approx(90.0)
    rows = again.ctl.status(NOW + 60, detail=True).timings
    assert [(r.host_id, r.phase, r.samples, r.authoritative, r.age_s) for r in rows] == [
        ("h1", "fetch", 5, True, 60.0)
    ]
    assert again.perf("h1").fetch_s == pytest.approx(90.0)  # type: ignore[union-attr]


def test_placement_prefers_the_host_that_really_warms_faster() -> None:
    hosts = [host("h1"), host("h2")]
    baseline = Harness(prof=profile())
    assert baseline.placed(hosts) == ("h1",)  # identical hosts: the first one wins the tie
    h = Harness(prof=profile())
    for _ in range(4):
        h.report("h1", "warm", 900.0)
    assert h.placed(hosts) == ("h2",)


def test_placement_prices_a_cold_fetch_not_a_verify_only_load() -> None:
    # h1 verifies cached copies quickly but downloads slowly; h2 downloads quickly. Neither
    # holds the weights now, so the fetch time decides.
    prof = profile(source=SOURCE)
    h = Harness(prof=prof)
    for _ in range(4):
        h.report("h1", "load", 2.0, fetched=False)
        h.report("h1", "load", 1200.0, fetched=True)
        h.report("h2", "load", 20.0, fetched=True)
        h.report("h2", "load", 10.0, fetched=False)
    hosts = [host("h1"), host("h2")]
    assert h.placed(hosts) == ("h2",)
    # With the exact weights cached on h1, its load phase disappears and h1 is preferred.
    cached = [host("h1", cached={"m": SHA_A}), host("h2")]
    assert h.placed(cached) == ("h1",)


def test_the_demand_startup_horizon_uses_the_learned_fastest_path() -> None:
    prof = profile(source=SOURCE)
    h = Harness(prof=prof)
    for _ in range(4):
        h.report("h1", "load", 400.0, fetched=True)
        h.report("h1", "warm", 50.0)
        h.report("h2", "load", 100.0, fetched=True)
        h.report("h2", "warm", 20.0)
    h.ctl.tick(NOW, [host("h1"), host("h2")])
    learned = list(h.seen[-1].hosts)
    assert startup_horizon_s(prof, learned, [True, True]) == pytest.approx(120.0)
    assert startup_horizon_s(prof, [host("h1"), host("h2")], [True, True]) == pytest.approx(40.0)


def test_startup_path_uses_fetch_only_when_the_profile_can_fetch() -> None:
    perf = ModelPerformance(warm_s=5.0, load_s=3.0, fetch_s=100.0)
    assert startup_path_s(profile(source=SOURCE), perf, cached=False) == 105.0
    assert startup_path_s(profile(), perf, cached=False) == 8.0
    assert startup_path_s(profile(source=SOURCE), perf, cached=True) == 5.0
    # A profile that can fetch never borrows the verify-only time when no fetch is learned.
    only_verify = ModelPerformance(warm_s=5.0, load_s=3.0)
    assert startup_path_s(profile(source=SOURCE), only_verify, cached=False) == 35.0
    assert startup_path_s(profile(), None, cached=False) == 40.0


def test_the_book_is_bounded() -> None:
    book = TimingBook()
    for i in range(MAX_TIMING_ENTRIES + 5):
        book.observe(
            host_id=f"h{i}",
            model_id="m",
            sha=None,
            kind="warm",
            artifact_fetched=False,
            duration_s=1.0,
            now=NOW + i,
        )
    assert len(book) == MAX_TIMING_ENTRIES
    assert book.get("h0", "m", None, "warm") is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 3600.0), min_size=1, max_size=30))
def test_the_learned_mean_stays_within_the_reported_range(samples: list[float]) -> None:
    book = TimingBook()
    for s in samples:
        assert book.observe(
            host_id="h",
            model_id="m",
            sha=None,
            kind="warm",
            artifact_fetched=False,
            duration_s=s,
            now=NOW,
        )
    e = book.get("h", "m", None, "warm")
    assert e is not None
    assert min(samples) - 1e-6 <= e.mean_s <= max(samples) + 1e-6
    assert e.samples == min(len(samples), TIMING_WINDOW)
    assert DAY < TIMING_EXPIRY_S
