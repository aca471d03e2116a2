"""Built-ins are defaults, not winners: per hook, a third-party plugin overrides them.

Each test installs a real distribution (a module plus dist-info with a ``grid`` entry point,
found through ``importlib.metadata`` exactly as after ``pip install``) next to every built-in
plugin, and proves the third-party implementation is the one Grid uses, whatever its name.
The names are chosen to sort *before* the built-ins (``acme_forecast`` < ``grid_forecast_ewma``),
which is the order that used to lose. ``test_every_hook_has_an_override_test`` keeps this file
complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grid_core.api import (
    Bucket,
    DemandSeries,
    ForecastPolicy,
    HostSnapshot,
    ModelProfile,
    PluginError,
    Plugins,
    RequestFeatures,
    ResidencySnapshot,
)
from grid_core.cli import build_app
from grid_core.planner import PlanInputs, PlannerPolicy, plan
from grid_core.testing import builtin_entry_points, plugins_with, write_distribution

NOW = 1_800_000_000.0
GB = 1024
POLICY = PlannerPolicy(admission_headroom_mb=0, admission_headroom_fraction=0.0)
"""Zero headroom keeps the memory arithmetic of these small fleets exact."""


def host(host_id: str, capacity_gb: int, **kw: object) -> HostSnapshot:
    return HostSnapshot(
        host_id=host_id,
        capacity_mb=capacity_gb * GB,
        runtimes=("llama.cpp",),
        heartbeat_age_s=1.0,
        failure_domain="fd-1",
        **kw,  # type: ignore[arg-type]  # test builder: keyword fields of HostSnapshot
    )


def model(model_id: str, memory_gb: int, **kw: object) -> ModelProfile:
    return ModelProfile(model_id=model_id, memory_mb=memory_gb * GB, **kw)  # type: ignore[arg-type]  # test builder


def res(model_id: str, memory_gb: int, **kw: object) -> ResidencySnapshot:
    return ResidencySnapshot(
        model_id=model_id,
        memory_mb=memory_gb * GB,
        state="ready",
        active_requests=kw.pop("active_requests", 0),  # type: ignore[arg-type]  # int
        loaded_at=NOW - 3600.0,
    )


DEFAULTS = tuple(ep.name for ep in builtin_entry_points())
"""Every installed built-in plugin: the overrides must win against all of them together."""


def _install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: str, source: str) -> Plugins:
    """Install ``source`` as distribution ``<entry>`` and load it beside every built-in."""
    monkeypatch.syspath_prepend(str(tmp_path))
    write_distribution(
        tmp_path, entry.replace("_", "-"), f"{entry}_plugin", source, entry_point=entry
    )
    lines: list[str] = []
    plugins = plugins_with(builtins=DEFAULTS, distributions=(tmp_path,), report=lines.append)
    assert entry in {info.name for info in plugins.infos}, lines
    assert plugins.infos[[i.name for i in plugins.infos].index(entry)].distribution == (
        entry.replace("_", "-")
    )
    return plugins


def _status(plugins: Plugins, hook: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    st = next(s for s in plugins.hook_status() if s.hook == hook)
    return st.active, st.shadowed


def _series() -> DemandSeries:
    width = 10.0
    current = int(NOW // width)
    return DemandSeries(
        model_id="m", bucket_s=width, buckets=[Bucket(index=current - 1, requests=100, served=100)]
    )


def test_hook_grid_forecast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugins = _install(
        tmp_path,
        monkeypatch,
        "acme_forecast",
        """
        from grid_core.api import Forecast, hookimpl

        @hookimpl
        def grid_forecast(series, now, policy):
            return Forecast(rate_rps=42.0)
        """,
    )
    forecast = plugins.forecast(_series(), NOW, ForecastPolicy())
    assert forecast is not None and forecast.rate_rps == 42.0
    assert _status(plugins, "grid_forecast") == (("acme_forecast",), ("grid_forecast_ewma",))
    # The same distribution on PYTHONPATH: `grid plugins --json` names the active forecaster.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", "plugins", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    hooks = {h["hook"]: h for h in json.loads(out.stdout)["hooks"]}
    assert hooks["grid_forecast"]["active"] == ["acme_forecast"]
    assert hooks["grid_forecast"]["shadowed"] == ["grid_forecast_ewma"]


def test_the_default_forecaster_answers_without_an_override() -> None:
    plugins = plugins_with(builtins=DEFAULTS)
    forecast = plugins.forecast(_series(), NOW, ForecastPolicy())
    assert forecast is not None and forecast.rate_rps == pytest.approx(10.0)
    assert _status(plugins, "grid_forecast") == (("grid_forecast_ewma",), ())


def _preemption_inputs() -> PlanInputs:
    idle = res("idle", 8)
    busy = res("busy", 8, active_requests=3)
    profiles = (
        model("vip", 8, min_replicas=1, priority=3),
        model("idle", 8, min_replicas=1),
        model("busy", 8, min_replicas=1),
    )
    return PlanInputs(
        now=NOW,
        profiles=profiles,
        hosts=(host("a", 16, residencies=(idle, busy)),),
        policy=POLICY,
    )


def test_hook_grid_select_victims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = _preemption_inputs()
    default = plan(inputs, plugins_with(builtins=DEFAULTS).planner_hooks(), reuse=False)
    assert [e.model_id for e in default.evictions] == ["idle"]  # the built-in spares busy work
    plugins = _install(
        tmp_path,
        monkeypatch,
        "aaa_victims",  # sorts before grid_victims
        """
        from grid_core.api import hookimpl

        @hookimpl
        def grid_select_victims(candidates, need, ctx):
            # An operator policy: always take the busiest residency that suffices.
            ranked = sorted(candidates, key=lambda c: c.idle)
            for c in ranked:
                if need.satisfied_by((c,)):
                    return (c,)
            return None
        """,
    )
    overridden = plan(inputs, plugins.planner_hooks(), reuse=False)
    assert [(e.model_id, e.beneficiary) for e in overridden.evictions] == [("busy", "vip")]
    assert _status(plugins, "grid_select_victims") == (("aaa_victims",), ("grid_victims",))


def test_hook_grid_placement_score_terms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = PlanInputs(
        now=NOW,
        profiles=(model("m", 4, min_replicas=1),),
        hosts=(host("small", 8), host("roomy", 32)),
        policy=POLICY,
    )
    default = plan(inputs, plugins_with(builtins=DEFAULTS).planner_hooks(), reuse=False)
    assert default.hosts_of("m") == ("small",)  # built-in best fit: the tightest host
    plugins = _install(
        tmp_path,
        monkeypatch,
        "acme_spread",
        """
        from grid_core.api import hookimpl

        class WorstFit:
            # Replaces the built-in term of the same name: leave the most room free.
            name = "best_fit"
            dynamic = True

            def score(self, model, host, ctx):
                return 20.0 * (ctx.free_mb - ctx.memory_mb) / max(1, ctx.allocatable_mb)

        @hookimpl
        def grid_placement_score_terms(register):
            register(WorstFit())
        """,
    )
    overridden = plan(inputs, plugins.planner_hooks(), reuse=False)
    assert overridden.hosts_of("m") == ("roomy",)
    st = next(s for s in plugins.hook_status() if s.hook == "grid_placement_score_terms")
    assert st.objects["best_fit"] == "acme_spread"
    assert st.objects["cached_weights"] == "grid_scoring"  # the other defaults stay
    assert "grid_scoring:best_fit" in st.shadowed


def test_hook_grid_classify_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    features = RequestFeatures(at=NOW, endpoint="chat", requested_model="auto")
    vocabulary = ("coding", "sales", "general")
    default = plugins_with(builtins=DEFAULTS)
    assert default.classify_request(features, "refactor the sql query", vocabulary) == "coding"
    plugins = _install(
        tmp_path,
        monkeypatch,
        "acme_classifier",
        """
        from grid_core.api import hookimpl

        @hookimpl
        def grid_classify_request(features, text, vocabulary):
            return "sales" if "sales" in vocabulary else None
        """,
    )
    assert plugins.classify_request(features, "refactor the sql query", vocabulary) == "sales"
    assert _status(plugins, "grid_classify_request") == (
        ("acme_classifier",),
        ("grid_classifier",),
    )


def test_hook_grid_runtime_adapters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert type(plugins_with(builtins=DEFAULTS).runtime_adapters()["llama.cpp"]).__module__ == (
        "grid_llamacpp.adapter"
    )
    plugins = _install(
        tmp_path,
        monkeypatch,
        "acme_llama",
        """
        from grid_core.api import hookimpl

        class PatchedLlama:
            # Replaces the built-in llama.cpp adapter (say, with a vendor build).
            name = "llama.cpp"

            async def load(self, host, artifact): ...
            async def warm(self, host, loaded, memory_mb): ...
            async def probe(self, host, child): ...
            async def drain(self, host, child, deadline_s): ...
            async def unload(self, host, child, *, idle_wait_s, force=False): ...
            async def adopt(self, host, child): ...

        @hookimpl
        def grid_runtime_adapters(register):
            register(PatchedLlama())
        """,
    )
    adapter = plugins.runtime_adapters()["llama.cpp"]
    assert type(adapter).__name__ == "PatchedLlama"
    st = next(s for s in plugins.hook_status() if s.hook == "grid_runtime_adapters")
    # The other built-in runtimes (vllm, ...) stay active beside the replacement.
    assert "acme_llama" in st.active and "grid_llamacpp" not in st.active
    assert st.objects["llama.cpp"] == "acme_llama"
    assert st.shadowed == ("grid_llamacpp", "grid_llamacpp:llama.cpp")


def test_hook_grid_gpu_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The built-in grid_gpu reads NVML: this CPU-only test machine has no NVIDIA driver.
    assert plugins_with(builtins=DEFAULTS).gpu_devices() == []
    plugins = _install(
        tmp_path,
        monkeypatch,
        "acme_gpu",
        """
        from grid_core.api import hookimpl
        from grid_core.wire import GpuDevice

        @hookimpl
        def grid_gpu_devices(register):
            register(GpuDevice(index=0, name="acme-a100", memory_total_mb=40960))
        """,
    )
    assert [(d.name, d.memory_total_mb) for d in plugins.gpu_devices()] == [("acme-a100", 40960)]
    # A collect hook: the plugin's devices are added to whatever the built-in finds.
    assert _status(plugins, "grid_gpu_devices")[0] == ("acme_gpu", "grid_gpu")


def test_hook_grid_search_portfolio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A third-party portfolio search installed through an entry point replaces the built-in
    ``grid_portfolio`` one: the controller asks it every tick and plans its mapping."""
    from grid_core.api import Controller, FileStateStore

    assert _status(plugins_with(builtins=DEFAULTS), "grid_search_portfolio")[0] == (
        "grid_portfolio",
    )
    plugins = _install(
        tmp_path,
        monkeypatch,
        "acme_portfolio",
        """
        from grid_core.api import PortfolioDecision, hookimpl

        CALLS = []

        @hookimpl
        def grid_search_portfolio(snapshot, ctx):
            CALLS.append(sorted(snapshot.workloads))
            return PortfolioDecision(
                mapping={w: "general-7b" for w in snapshot.workloads}, reason="acme: generalist"
            )
        """,
    )
    assert _status(plugins, "grid_search_portfolio") == (("acme_portfolio",), ("grid_portfolio",))
    ctl = Controller(plugins=plugins, store=FileStateStore(tmp_path / "state.json")).restore()
    coder = model("coder-7b", 4, workload_scores={"coding": 1.0})
    general = model("general-7b", 4, workload_scores={"coding": 0.5, "general": 1.0})
    for p in (coder, general):
        ctl.put_profile(p, NOW)
    for i in range(5):
        ctl.observe_request(
            RequestFeatures(
                at=NOW + i,
                endpoint="chat",
                requested_model="auto",
                workload="coding",
                outcome="unavailable",
            )
        )
    result = ctl.tick(NOW + 10, [host("h1", 32)])
    import acme_portfolio_plugin  # the installed distribution's module

    assert acme_portfolio_plugin.CALLS == [["coding"]]
    assert result.plan.hosts_of("general-7b") == ("h1",)
    assert result.plan.hosts_of("coder-7b") == ()
    report = ctl.last.portfolio
    assert report is not None and report.mapping == {"coding": "general-7b"}
    assert report.reason == "acme: generalist"


def test_hook_grid_cli_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugins = _install(
        tmp_path,
        monkeypatch,
        "acme_cli",
        """
        import typer
        from grid_core.api import hookimpl

        def hello(name: str = typer.Option("fleet", "--name")) -> None:
            '''Say hello.'''
            typer.echo(f"hello {name} from acme")

        @hookimpl
        def grid_cli_commands(cli):
            cli.group("acme", help="Acme tools.").command(name="hello")(hello)
        """,
    )
    result = CliRunner().invoke(build_app(plugins), ["acme", "hello", "--name", "ops"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "hello ops from acme"
    assert "acme_cli" in _status(plugins, "grid_cli_commands")[0]


def test_hook_grid_node_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tools start node agents through the launcher the hook answers: by default the node
    package's, and a third-party launcher (a supervisor that runs agents its own way) wins."""
    from grid_node.launch import NodeAgentLauncher

    assert isinstance(plugins_with(builtins=DEFAULTS).node_launcher(), NodeAgentLauncher)
    plugins = _install(
        tmp_path,
        monkeypatch,
        "acme_launcher",
        """
        from grid_core.api import NodeProcesses, hookimpl

        class SupervisedNodes:
            def start(self, config_file, *, env=None):
                return NodeProcesses(agent_pid=4242, agent_running=True)

            def stop(self, state_dir, *, force=False):
                return [f"acme supervisor stopped {state_dir.name}"]

            def processes(self, state_dir):
                return NodeProcesses()

        @hookimpl
        def grid_node_launcher():
            return SupervisedNodes()
        """,
    )
    launcher = plugins.node_launcher()
    assert launcher.start(tmp_path / "node-config.json").agent_pid == 4242
    assert launcher.stop(tmp_path / "host-01") == ["acme supervisor stopped host-01"]
    assert _status(plugins, "grid_node_launcher") == (("acme_launcher",), ("grid_node",))


def test_a_launcher_without_stop_is_refused_naming_the_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugins = _install(
        tmp_path,
        monkeypatch,
        "acme_halfway",
        """
        from grid_core.api import NodeProcesses, hookimpl

        class StartOnly:
            def start(self, config_file, *, env=None):
                return NodeProcesses()

            def processes(self, state_dir):
                return NodeProcesses()

        @hookimpl
        def grid_node_launcher():
            return StartOnly()
        """,
    )
    with pytest.raises(PluginError, match=r"plugin acme_halfway: .* lacks stop\(\)"):
        plugins.node_launcher()
