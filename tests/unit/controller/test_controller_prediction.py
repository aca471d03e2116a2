"""The controller learns a workflow A→B under one affinity key and prewarms B on spare capacity.

Specification, "Proactive observation and portfolio planning": five repeated transitions under
a session's (hashed) affinity key are the proof; status labels the prediction with its edge and
confidence; with the prediction plugin disabled nothing is inferred.
"""

from __future__ import annotations

from pathlib import Path

from grid_core.controller import Controller
from grid_core.demand.features import RequestFeatures
from grid_core.demand.inference import InferredDemand
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot
from grid_core.system.state_file import FileStateStore
from grid_core.testing import InlinePlugin, plugins_with

NOW = 1_790_000_000.0
BUILTINS = ("grid_forecast_ewma", "grid_scoring", "grid_victims", "grid_portfolio")
A = ModelProfile(model_id="a", memory_mb=2_000)
B = ModelProfile(model_id="b", memory_mb=2_000)


def _controller(tmp: Path, predictive: bool) -> Controller:
    builtins = (*BUILTINS, "grid_sequence") if predictive else BUILTINS
    store = FileStateStore(tmp / "controller-state.json")
    ctl = Controller(plugins=plugins_with(builtins=builtins), store=store).restore()
    for p in (A, B):
        ctl.put_profile(p, NOW)
    return ctl


def _hosts() -> tuple[HostSnapshot, ...]:
    return tuple(
        HostSnapshot(
            host_id=h, capacity_mb=8_000, runtimes=("llama.cpp",), heartbeat_age_s=1.0, max_models=1
        )
        for h in ("h1", "h2")
    )


def _req(model: str, at: float, key: str) -> RequestFeatures:
    return RequestFeatures(
        at=at,
        endpoint="chat",
        requested_model=model,
        served_model=model,
        service_time_s=1.0,
        affinity_hash=key,
    )


def _workflow(ctl: Controller, repeats: int) -> float:
    t = NOW
    for _ in range(repeats):
        ctl.observe_request(_req("a", t, "session-1"))
        ctl.observe_request(_req("b", t + 40, "session-1"))
        t += 700  # B's evidence is long out of its live window when A comes again
    ctl.observe_request(_req("a", t, "session-1"))
    return t + 1


def test_five_repeats_prewarm_b_and_status_names_the_edge(tmp_path: Path) -> None:
    ctl = _controller(tmp_path, predictive=True)
    now = _workflow(ctl, 5)
    result = ctl.tick(now, _hosts())
    assert {a.model_id for a in result.plan.assignments} == {"a", "b"}
    status = ctl.status(now)
    [row] = [p for p in status.predictions if p.model_id == "b"]
    assert (row.kind, row.edge, row.confidence, row.support) == ("sequence", "a→b", 1.0, 5)
    assert row.lead_s == 40.0
    assert status.forecasts["b"]["direct"] is False
    assert "sequence" in status.forecasts["b"]["reasons"]


def test_four_repeats_or_no_plugin_predict_nothing(tmp_path: Path) -> None:
    ctl = _controller(tmp_path / "four", predictive=True)
    now = _workflow(ctl, 4)
    ctl.tick(now, _hosts())
    # Four repeats are no sequence proof (a minute-apart co-activation pair may still be).
    assert [p for p in ctl.status(now).predictions if p.kind == "sequence"] == []
    ctl = _controller(tmp_path / "reactive", predictive=False)
    now = _workflow(ctl, 5)
    result = ctl.tick(now, _hosts())
    assert {a.model_id for a in result.plan.assignments} == {"a"}


def test_learned_workflows_survive_a_restart(tmp_path: Path) -> None:
    ctl = _controller(tmp_path, predictive=True)
    now = _workflow(ctl, 5)
    ctl.set_mode("automatic", now)  # automatic mode saves the document on every tick
    ctl.tick(now, _hosts())
    again = _controller(tmp_path, predictive=True)
    result = again.tick(now + 1, _hosts())
    assert "b" in {a.model_id for a in result.plan.assignments}


def test_hook_grid_infer_demand(tmp_path: Path) -> None:
    """An installed plugin's ``grid_infer_demand`` replaces the built-in one; its rows are
    still folded in as inferred demand only."""
    acme = InlinePlugin("acme")

    @acme.hook
    def grid_infer_demand(sequences, coactivation, demand, workload_models, now):  # type: ignore[no-untyped-def]  # hook signature from the spec
        del sequences, coactivation, workload_models, now
        assert "b" in demand
        return [
            InferredDemand(
                model_id="b", kind="pair", edge="acme→b", confidence=0.9, support=3, rate_rps=0.1
            )
        ]

    store = FileStateStore(tmp_path / "controller-state.json")
    ctl = Controller(
        plugins=plugins_with(acme, builtins=(*BUILTINS, "grid_sequence")), store=store
    ).restore()
    for p in (A, B):
        ctl.put_profile(p, NOW)
    ctl.observe_request(_req("a", NOW, "k"))
    result = ctl.tick(NOW + 1, _hosts())
    assert {a.model_id for a in result.plan.assignments} == {"a", "b"}
    assert [p.edge for p in ctl.status(NOW + 1).predictions] == ["acme→b"]


SHA_B = "b" * 64
B_SOURCED = ModelProfile(
    model_id="b",
    memory_mb=2_000,
    artifact_sha256=SHA_B,
    artifact_source="hf://owner/repo/b.gguf",
    artifact_size_mb=2_000,
)
C = ModelProfile(model_id="c", memory_mb=2_000, min_replicas=1)


def _full_hosts(free_disk_mb: int | None) -> tuple[HostSnapshot, ...]:
    return tuple(
        HostSnapshot(
            host_id=h,
            capacity_mb=8_000,
            runtimes=("llama.cpp",),
            heartbeat_age_s=1.0,
            max_models=1,
            artifact_disk_free_mb=free_disk_mb,
            actuator_capabilities=("load", "warm", "drain", "unload", "evict"),
            residencies=(
                ResidencySnapshot(
                    model_id=m,
                    memory_mb=2_000,
                    state="ready",
                    active_requests=0,
                    loaded_at=NOW - 7_200,
                    last_used_at=NOW - 7_200,
                    routable=True,
                ),
            ),
        )
        for h, m in (("h1", "a"), ("h2", "c"))
    )


def test_without_a_free_slot_the_prediction_is_a_cache_only_fetch(tmp_path: Path) -> None:
    store = FileStateStore(tmp_path / "controller-state.json")
    ctl = Controller(
        plugins=plugins_with(builtins=(*BUILTINS, "grid_sequence")), store=store
    ).restore()
    for p in (A, B_SOURCED, C):
        ctl.put_profile(p, NOW)
    now = _workflow(ctl, 5)
    ctl.set_mode("automatic", now)
    result = ctl.tick(now, _full_hosts(free_disk_mb=60_000))
    issued = [ctl.book.get(i) for i in result.issued]
    kinds = [(a.kind, a.model_id, a.reason) for a in issued if a is not None]
    # Nothing warms, nothing drains or unloads: one exact, cache-only load of b.
    assert [k for k in kinds if k[1] == "b"] == [("load", "b", "predictive_prefetch")]
    assert not [k for k in kinds if k[0] in ("warm", "drain", "unload", "evict")]
    # The command a node receives names where to fetch from and how big it is: a node
    # refuses a download without them, so a prediction without them never reaches disk.
    [fetch_action] = [a for a in issued if a is not None and a.model_id == "b"]
    hosts = _full_hosts(free_disk_mb=60_000)
    delivered = ctl.deliver(fetch_action.host_id, now, hosts, ctl.revisions.dirty).commands
    [cmd] = [c for c in delivered if c.model_id == "b"]
    assert (cmd.artifact_source, cmd.artifact_sha256, cmd.artifact_size_mb) == (
        "hf://owner/repo/b.gguf",
        SHA_B,
        2_000,
    )
    [fetch] = ctl.status(now).prefetch.advisories
    assert (fetch.kind, fetch.model_id, fetch.artifact_sha256, fetch.edge) == (
        "fetch",
        "b",
        SHA_B,
        "a→b",
    )


def test_a_prediction_never_fetches_under_the_disk_floor_or_without_disk_telemetry(
    tmp_path: Path,
) -> None:
    for i, free in enumerate((None, 10 * 1024 + 1_999)):
        store = FileStateStore(tmp_path / f"s{i}" / "controller-state.json")
        store.path.parent.mkdir()
        ctl = Controller(
            plugins=plugins_with(builtins=(*BUILTINS, "grid_sequence")), store=store
        ).restore()
        for p in (A, B_SOURCED, C):
            ctl.put_profile(p, NOW)
        now = _workflow(ctl, 5)
        ctl.set_mode("automatic", now)
        result = ctl.tick(now, _full_hosts(free_disk_mb=free))
        issued = [ctl.book.get(x) for x in result.issued]
        assert not [a for a in issued if a is not None and a.model_id == "b"]
        assert ctl.status(now).prefetch.refused


def test_grid_allocator_status_shows_the_edge_and_the_cache_advisory(tmp_path: Path) -> None:
    """The operator's status view renders what the JSON holds: the learned edge with its
    confidence, and the cache-only fetch."""
    import msgspec
    from rich.console import Console

    from grid_server.cli_render import status_view

    store = FileStateStore(tmp_path / "controller-state.json")
    ctl = Controller(
        plugins=plugins_with(builtins=(*BUILTINS, "grid_sequence")), store=store
    ).restore()
    for p in (A, B_SOURCED, C):
        ctl.put_profile(p, NOW)
    now = _workflow(ctl, 5)
    ctl.tick(now, _full_hosts(free_disk_mb=60_000))
    doc = {"server": {}, "controller": msgspec.to_builtins(ctl.status(now))}
    console = Console(width=200, record=True)
    console.print(status_view(doc))
    text = console.export_text()
    assert "Predictions" in text and "a→b" in text and "1.00" in text
    assert "Predictive cache" in text and "predictive_prefetch" in text
