"""The public plugin contract holds: typed, validated, documented, and defaults stay defaults.

Datasette-style meta-tests: adding a hook spec without an override test
(``test_hook_<name>``) or without a section in ``docs/plugins.md`` fails here.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from pathlib import Path

import pytest

import grid_core.api as api
from grid_core import hookspecs
from grid_core.api import GpuDevice, RuntimeAdapter, ScoreTerm, hookimpl
from grid_core.plugins import hook_names
from grid_core.testing import InlinePlugin, builtin_entry_points, plugins_with

ROOT = Path(__file__).resolve().parents[3]
HOOKS = hook_names()


def test_the_hook_list_is_what_grid_defines() -> None:
    assert HOOKS == [
        "grid_classify_request",
        "grid_cli_commands",
        "grid_forecast",
        "grid_gpu_devices",
        "grid_infer_demand",
        "grid_node_launcher",
        "grid_placement_score_terms",
        "grid_runtime_adapters",
        "grid_search_portfolio",
        "grid_select_victims",
    ]


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_an_override_test(hook: str) -> None:
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    assert re.search(rf"^def test_hook_{hook}\(", sources, re.M), (
        f"add test_hook_{hook}: install a third-party plugin and prove it wins"
    )


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented(hook: str) -> None:
    docs = (ROOT / "docs" / "plugins.md").read_text()
    assert re.search(rf"^#+ .*`{hook}`", docs, re.M), f"document {hook} in docs/plugins.md"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_specs_are_fully_typed(hook: str) -> None:
    spec = getattr(hookspecs, hook)
    sig = inspect.signature(spec)
    for name, param in sig.parameters.items():
        assert param.annotation not in (inspect.Parameter.empty, "object"), f"{hook}({name})"
        assert "object" not in str(param.annotation).split("[")[0], f"{hook}({name}) is object"
    assert sig.return_annotation is not inspect.Signature.empty


def _builtin_impls() -> list[tuple[str, str, bool]]:
    out = []
    for ep in builtin_entry_points():
        if ep.dist is None or ep.dist.metadata["Name"] != "grid":
            continue
        module = ep.load()
        for hook in HOOKS:
            fn = getattr(module, hook, None)
            opts = getattr(fn, f"{hookspecs.PROJECT_NAME}_impl", None)
            if opts is not None:
                out.append((ep.name, hook, bool(opts.get("trylast"))))
    return out


def test_every_builtin_first_result_or_collect_impl_is_a_default() -> None:
    overridable = {
        h
        for h in HOOKS
        if getattr(hookspecs, h).grid_spec.get("firstresult")
        or h in ("grid_runtime_adapters", "grid_placement_score_terms", "grid_gpu_devices")
    }
    impls = [(p, h, last) for p, h, last in _builtin_impls() if h in overridable]
    assert {h for _, h, _ in impls} >= {
        "grid_forecast",
        "grid_select_victims",
        "grid_classify_request",
        "grid_placement_score_terms",
        "grid_runtime_adapters",
    }
    assert [(p, h) for p, h, last in impls if not last] == []


def test_the_api_module_exports_what_it_lists() -> None:
    assert api.hookimpl is hookspecs.hookimpl
    missing = [name for name in api.__all__ if not hasattr(api, name)]
    assert missing == []
    assert api.ENTRY_POINT_GROUP == "grid"
    assert {ep.group for ep in importlib.metadata.entry_points(group="grid")} == {"grid"}


def test_builtins_satisfy_their_protocols() -> None:
    plugins = plugins_with(builtins=("grid_llamacpp", "grid_scoring"))
    assert all(isinstance(a, RuntimeAdapter) for a in plugins.runtime_adapters().values())
    assert all(isinstance(t, ScoreTerm) for t in plugins.score_terms())
    from grid_core.wire import GpuDevice as WireGpu

    assert isinstance(WireGpu(index=0, name="g", memory_total_mb=1), GpuDevice)


def _refusals(*inline: InlinePlugin) -> tuple[list[str], object]:
    lines: list[str] = []
    return lines, plugins_with(*inline, report=lines.append)


def test_a_malformed_runtime_adapter_is_refused_with_one_line() -> None:
    acme = InlinePlugin("acme_runtime")

    class HalfAdapter:
        name = "acme"

        async def load(self, host, artifact):  # type: ignore[no-untyped-def]
            return None

        def warm(self, host, loaded, memory_mb):  # type: ignore[no-untyped-def]  # not async
            return None

    @acme.hook
    def grid_runtime_adapters(register):  # type: ignore[no-untyped-def]
        register(HalfAdapter())

    lines: list[str] = []
    plugins = plugins_with(acme, builtins=("grid_llamacpp",), report=lines.append)
    assert set(plugins.runtime_adapters()) == {"llama.cpp"}  # the good adapter still loads
    assert lines == [
        "grid: plugin 'acme_runtime' registered a runtime adapter 'acme' that was refused: it "
        "lacks warm() as a coroutine (async def), async probe(), async drain(), async unload(), "
        "async adopt() (see grid_core.api.RuntimeAdapter)"
    ]
    assert [(f.name, f.loaded) for f in plugins.failures] == [("acme_runtime", True)]


def test_a_malformed_score_term_and_gpu_device_are_refused() -> None:
    acme = InlinePlugin("acme")

    class Nameless:
        def score(self, model, host, ctx):  # type: ignore[no-untyped-def]
            return 0.0

    class NoIndex:
        name = "gpu"
        memory_total_mb = 1
        memory_used_mb = None

    @acme.hook
    def grid_placement_score_terms(register):  # type: ignore[no-untyped-def]
        register(Nameless())

    @acme.hook
    def grid_gpu_devices(register):  # type: ignore[no-untyped-def]
        register(NoIndex())

    lines: list[str] = []
    plugins = plugins_with(acme, report=lines.append)
    assert plugins.score_terms() == []
    assert plugins.gpu_devices() == [] and plugins.gpu_devices() == []
    assert lines == [
        "grid: plugin 'acme' registered a score term that was refused: it lacks name (a "
        "non-empty str) (see grid_core.api.ScoreTerm)",
        "grid: plugin 'acme' registered a GPU device 'gpu' that was refused: it lacks index "
        "(see grid_core.api.GpuDevice)",
    ]  # the GPU refusal is said once, not on every heartbeat


def test_an_implementation_with_unknown_arguments_is_refused_with_one_line() -> None:
    class Typo:
        @hookimpl
        def grid_forecast(self, series, now, polcy):  # type: ignore[no-untyped-def]
            return None

    lines: list[str] = []
    plugins = plugins_with(("typo_forecast", Typo()), report=lines.append)
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("grid: plugin 'typo_forecast' was not loaded: registration failed")
    assert "polcy" in lines[0]
    assert not plugins.has_impl("grid_forecast")
