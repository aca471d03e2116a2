"""The typed facade reaches each hook, and first-result hooks stop at the first answer."""

from __future__ import annotations

from types import SimpleNamespace

from grid_core import hookimpl
from grid_core.testing import plugins_with


class Forecaster:
    @hookimpl
    def grid_forecast(self, series, now, policy):  # type: ignore[no-untyped-def]
        return ("forecast", series, now)


class SilentForecaster:
    @hookimpl(tryfirst=True)
    def grid_forecast(self, series, now, policy):  # type: ignore[no-untyped-def]
        return None  # declines: the next plugin answers


class Portfolio:
    @hookimpl
    def grid_search_portfolio(self, snapshot, ctx):  # type: ignore[no-untyped-def]
        return {"coding": "coder-7b"}


class Gpu:
    @hookimpl
    def grid_gpu_devices(self, register):  # type: ignore[no-untyped-def]
        register(SimpleNamespace(index=0, name="gpu0", memory_total_mb=24576, memory_used_mb=None))


class Victims:
    @hookimpl
    def grid_select_victims(self, candidates, need, ctx):  # type: ignore[no-untyped-def]
        return list(candidates)[:1]


class Terms:
    @hookimpl
    def grid_placement_score_terms(self, register):  # type: ignore[no-untyped-def]
        register(SimpleNamespace(name="b", score=lambda m, h, c: 1.0))
        register(SimpleNamespace(name="a", score=lambda m, h, c: 2.0))


def test_first_result_skips_declining_plugins() -> None:
    plugins = plugins_with(("f", Forecaster()), ("silent", SilentForecaster()))
    assert plugins.forecast("series", 10.0, None) == ("forecast", "series", 10.0)


def test_without_an_implementation_first_result_hooks_answer_none() -> None:
    plugins = plugins_with()
    assert plugins.search_portfolio(None, None) is None
    assert plugins.forecast(None, 0.0, None) is None
    assert plugins.select_victims([], None, None) is None
    assert plugins.classify_request(None, "", ("general",)) is None
    assert not plugins.has_impl("grid_search_portfolio")


def test_each_hook_is_reached_through_the_facade() -> None:
    plugins = plugins_with(("p", Portfolio()), ("g", Gpu()), ("v", Victims()), ("t", Terms()))
    assert plugins.search_portfolio(None, None) == {"coding": "coder-7b"}
    assert [d.memory_total_mb for d in plugins.gpu_devices()] == [24576]
    assert plugins.select_victims(["x", "y"], None, None) == ["x"]
    assert [t.name for t in plugins.score_terms()] == ["a", "b"]  # deterministic order
    assert plugins.has_impl("grid_search_portfolio")
