"""Plugin discovery through entry points, failure isolation and ``grid plugins``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grid_core import hookimpl
from grid_core.errors import PluginError
from grid_core.plugins import disabled_names, load_plugins
from grid_core.testing import builtin_entry_points, plugins_with

BUILTINS = {
    "grid_forecast_ewma",
    "grid_scoring",
    "grid_victims",
    "grid_classifier",
    "grid_llamacpp",
    "grid_lab",
    "grid_bench",
    "grid_server",
    "grid_node",
    "grid_fleet",
}


def _write_dist(root: Path, dist: str, version: str, module: str, source: str) -> None:
    """A minimal installed distribution: a module plus dist-info with a ``grid`` entry point."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[grid]\n{module} = {module}\n")


def _grid(*args: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **env_extra}
    return subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture
def third_party(tmp_path: Path) -> Path:
    _write_dist(
        tmp_path,
        "acme-grid-runtime",
        "1.2.3",
        "acme_grid_runtime",
        """
        from grid_core import hookimpl

        class Adapter:
            name = "acme"

        @hookimpl
        def grid_runtime_adapters(register):
            register(Adapter())
    """,
    )
    _write_dist(
        tmp_path,
        "broken-grid-plugin",
        "0.1",
        "broken_grid_plugin",
        """
        raise RuntimeError("this plugin is broken on purpose")
    """,
    )
    return tmp_path


def test_builtin_plugins_are_found_through_entry_points() -> None:
    names = {ep.name for ep in builtin_entry_points()}
    assert names >= BUILTINS


def test_grid_plugins_json_lists_builtins_third_party_and_broken(third_party: Path) -> None:
    result = _grid("plugins", "--json", env_extra={"PYTHONPATH": str(third_party)})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    loaded = {p["name"]: p for p in report["plugins"]}
    assert set(loaded) >= BUILTINS | {"acme_grid_runtime"}
    acme = loaded["acme_grid_runtime"]
    assert (acme["distribution"], acme["version"]) == ("acme-grid-runtime", "1.2.3")
    assert acme["hooks"] == ["grid_runtime_adapters"]
    assert loaded["grid_server"]["distribution"] == "grid"
    failures = {f["name"]: f["cause"] for f in report["failures"]}
    assert "this plugin is broken on purpose" in failures["broken_grid_plugin"]
    # one clear line on stderr names the broken plugin
    lines = [ln for ln in result.stderr.splitlines() if "broken_grid_plugin" in ln]
    assert len(lines) == 1 and "RuntimeError" in lines[0]


def test_grid_plugins_table_shows_third_party(third_party: Path) -> None:
    result = _grid("plugins", env_extra={"PYTHONPATH": str(third_party)})
    assert result.returncode == 0
    row = next(ln for ln in result.stdout.splitlines() if ln.startswith("acme_grid_runtime"))
    assert "acme-grid-runtime" in row and "1.2.3" in row and "grid_runtime_adapters" in row


def test_disable_plugins_environment_skips_named_plugins(third_party: Path) -> None:
    result = _grid(
        "plugins",
        "--json",
        env_extra={
            "PYTHONPATH": str(third_party),
            "GRID_DISABLE_PLUGINS": "acme_grid_runtime, broken_grid_plugin",
        },
    )
    report = json.loads(result.stdout)
    names = {p["name"] for p in report["plugins"]}
    assert "acme_grid_runtime" not in names
    assert report["failures"] == []
    assert disabled_names({"GRID_DISABLE_PLUGINS": "a,,b "}) == {"a", "b"}


def test_misspelled_hook_fails_loudly() -> None:
    class Typo:
        @hookimpl
        def grid_forcast(self) -> None:  # misspelled on purpose
            """Not a Grid hook."""

    with pytest.raises(PluginError, match="grid_forcast"):
        load_plugins(entry_points=[], extra=[("typo", Typo())], report=lambda _l: None)


class _Adapter:
    """The smallest object that satisfies grid_core.api.RuntimeAdapter (never started)."""

    name = "same"

    async def load(self, host, artifact):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    warm = probe = drain = unload = adopt = load


def test_duplicate_runtime_name_is_a_clear_error() -> None:
    A = _Adapter

    class P1:
        @hookimpl
        def grid_runtime_adapters(self, register):  # type: ignore[no-untyped-def]
            register(A())

    class P2(P1):
        pass

    plugins = plugins_with(("p1", P1()), ("p2", P2()))
    with pytest.raises(PluginError, match="two plugins registered a runtime adapter named 'same' "):
        plugins.runtime_adapters()


def test_registration_failure_is_reported_and_others_keep_working() -> None:
    lines: list[str] = []

    class Good:
        @hookimpl
        def grid_classify_request(self, features, text, vocabulary):  # type: ignore[no-untyped-def]
            return vocabulary[0]

    class NotAPlugin:
        @hookimpl
        def grid_forecast(self, nonsense_argument):  # type: ignore[no-untyped-def]
            return None

    plugins = load_plugins(
        entry_points=[], extra=[("bad", NotAPlugin()), ("good", Good())], report=lines.append
    )
    assert [f.name for f in plugins.failures] == ["bad"]
    assert len(lines) == 1 and "'bad'" in lines[0]
    assert plugins.classify_request(None, "", ("coding",)) == "coding"


def test_grid_plugins_table_names_providers_collect_kinds_and_refusals_once(
    tmp_path: Path,
) -> None:
    _write_dist(
        tmp_path,
        "zeta-grid-runtime",
        "2.0",
        "zeta_grid_runtime",
        """
        from grid_core import hookimpl

        class Adapter:
            name = "zeta"

            async def load(self, *args, **kwargs): ...
            async def warm(self, *args, **kwargs): ...
            async def probe(self, *args, **kwargs): ...
            async def drain(self, *args, **kwargs): ...
            async def unload(self, *args, **kwargs): ...
            async def adopt(self, *args, **kwargs): ...

        @hookimpl
        def grid_runtime_adapters(register):
            register(Adapter())
    """,
    )
    _write_dist(
        tmp_path,
        "half-grid-runtime",
        "0.1",
        "half_grid_runtime",
        """
        from grid_core import hookimpl

        class Adapter:
            name = "half"

        @hookimpl
        def grid_runtime_adapters(register):
            register(Adapter())
    """,
    )
    result = _grid("plugins", env_extra={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    rows = {ln.split()[0]: ln.split() for ln in result.stdout.splitlines() if ln.split()}
    # which plugin provides each named object, as --json says
    assert rows["zeta"][-1] == "zeta_grid_runtime" and rows["llama.cpp"][-1] == "grid_llamacpp"
    assert rows["best_fit"][-1] == "grid_scoring"
    # GPU devices are collected (every plugin's devices are kept), as the docs say
    assert rows["grid_gpu_devices"][1] == "collect"
    # a refused adapter is "refused", not "shadowed", and its reason is printed once
    adapters = rows["grid_runtime_adapters"]
    assert adapters[-1] == "half_grid_runtime" and adapters[-2] == "-"
    reason = [ln for ln in (result.stdout + result.stderr).splitlines() if "'half'" in ln]
    assert len(reason) == 1 and "refused" in reason[0]
