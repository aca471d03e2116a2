"""The dashboard in a real browser, on a running logical fleet of real llama-server engines.

Headless Chromium (Debian's package, driven by selenium through Debian's chromedriver) opens
``/dashboard`` of a two-host fleet started with ``grid test start``. It must show every host
and the baseline model ready; a request for a cold model sent through the OpenAI API must
then change that model's residency on the page without a reload. ``/metrics`` is scraped
while the fleet runs and parsed with the Prometheus client's parser. Screenshots are written
to ``build/screenshots/`` (docs/observability.md shows one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from browser_driver import chromium
from fleet_cli import fleet_status, started_fleet
from ports import port
from prometheus_client.parser import text_string_to_metric_families
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = pytest.mark.e2e

ENGINE_PORT_BASE = port(23300)
"""Engine ports for this module's fleet: clear of the other e2e modules' ranges."""
PAGE_TIMEOUT_S = 120.0
"""The page must show the fleet within this (it polls every 1.5 s)."""
COLD_LOAD_TIMEOUT_S = 300.0
"""A cold tiny model loads and warms in seconds; two shared cores under load take longer."""
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict]]:
    home = tmp_path_factory.mktemp("dash-home")
    with started_fleet(home, machines=2, capacities_gib="3,3", engine_port_base=ENGINE_PORT_BASE):
        yield home, fleet_status(home)


def wait_for(driver: WebDriver, what: str, check: Callable[[WebDriver], object], timeout: float):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.5).until(check)
    except Exception as exc:
        shot = SCREENSHOTS / f"failed-{what.replace(' ', '-')}.png"
        driver.save_screenshot(str(shot))
        msg = f"the dashboard never showed {what} within {timeout:.0f} s (screenshot {shot})"
        raise AssertionError(msg) from exc


def attr(driver: WebDriver, element_id: str, name: str) -> str | None:
    """One attribute read in the page itself (atomic: the page redraws every 1.5 s, so a
    located element may be replaced before a second round trip could read it)."""
    script = (
        "const e = document.getElementById(arguments[0]);"
        "return e ? e.getAttribute(arguments[1]) : null;"
    )
    return driver.execute_script(script, element_id, name)


def text_of(driver: WebDriver, element_id: str) -> str:
    script = "const e = document.getElementById(arguments[0]); return e ? e.textContent : '';"
    return driver.execute_script(script, element_id)


def cell_state(driver: WebDriver, host: str, model: str) -> str | None:
    return attr(driver, f"cell-{host}-{model}", "data-state")


def states_of(driver: WebDriver, hosts: list[str], model: str) -> dict[str, str | None]:
    return {h: cell_state(driver, h, model) for h in hosts}


def test_dashboard_shows_the_fleet_and_a_cold_load_live(fleet, tmp_path: Path) -> None:
    home, doc = fleet
    url = doc["url"]
    hosts = [h["host_id"] for h in doc["hosts"]]
    models = sorted(doc["models"], key=lambda m: m["priority"])
    baseline = next(m["model_id"] for m in models if m["min_replicas"] == 1)
    cold = next(m["model_id"] for m in models if m["min_replicas"] == 0)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    profile = tmp_path / "chromium"
    profile.mkdir()
    with chromium(profile) as driver:
        driver.get(f"{url}/dashboard")
        wait_for(
            driver,
            "every host",
            lambda d: all(attr(d, f"host-{h}", "data-host") == h for h in hosts),
            PAGE_TIMEOUT_S,
        )
        wait_for(
            driver,
            f"{baseline} ready",
            lambda d: "ready" in states_of(d, hosts, baseline).values(),
            PAGE_TIMEOUT_S,
        )

        # Each host shows its live protection state (a loaded machine may be throttled).
        def page_matches_api(d: WebDriver) -> bool:
            doc = httpx.get(f"{url}/allocator/status", trust_env=False, timeout=30.0).json()
            api = {
                n["host_id"]: n["state"] for n in doc["server"]["nodes"] if n["role"] == "allocator"
            }
            return all(attr(d, f"host-{h}", "data-state") == api.get(h) for h in hosts)

        wait_for(driver, "each host's protection state", page_matches_api, PAGE_TIMEOUT_S)
        assert attr(driver, "mode", "data-mode") == "automatic"
        assert all(s in (None, "absent") for s in states_of(driver, hosts, cold).values())
        driver.save_screenshot(str(SCREENSHOTS / "dashboard-baseline.png"))
        # Mark this page instance: a reload would lose the mark.
        driver.execute_script("window.gridTestMark = 'same page';")

        first = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": cold, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            timeout=60.0,
            trust_env=False,
        )
        assert first.status_code == 503 and first.headers.get("retry-after"), first.text
        seen: set[str] = set()

        def cold_is_ready(d: WebDriver) -> bool:
            now = {s for s in states_of(d, hosts, cold).values() if s and s != "absent"}
            seen.update(now)
            return "ready" in now

        wait_for(driver, f"{cold} ready", cold_is_ready, COLD_LOAD_TIMEOUT_S)
        assert driver.execute_script("return window.gridTestMark") == "same page"
        # The residency changed on the page: it passed through a cold state or landed ready.
        assert seen & {"loading", "warming", "ready"}
        answered = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": cold, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            timeout=120.0,
            trust_env=False,
        )
        assert answered.status_code == 200, answered.text
        wait_for(
            driver,
            "the finished load in recent actions",
            lambda d: cold in text_of(d, "actions"),
            PAGE_TIMEOUT_S,
        )
        lines = driver.execute_script(
            "return document.querySelectorAll(`.chart[data-model='${arguments[0]}'] polyline`)"
            ".length;",
            cold,
        )
        assert lines == 4, "demand, concurrency, desired and ready series"
        driver.save_screenshot(str(SCREENSHOTS / "dashboard-cold-loaded.png"))
        _scrape_metrics(url, baseline, cold, hosts)
        _kill_switch(driver, home)
        driver.save_screenshot(str(SCREENSHOTS / "dashboard-kill-switch.png"))


def _scrape_metrics(url: str, baseline: str, cold: str, hosts: list[str]) -> None:
    """``/metrics`` during the run: every family group present, values that make sense."""
    text = httpx.get(f"{url}/metrics", trust_env=False, timeout=30.0).text
    fams = {f.name: f.samples for f in text_string_to_metric_families(text)}

    def total(name: str, sample: str, **labels: str) -> float:
        return sum(
            s.value for s in fams[name] if s.name == sample and labels.items() <= s.labels.items()
        )

    assert total("grid_controller_mode", "grid_controller_mode", mode="automatic") == 1
    assert total("grid_controller_authority_held", "grid_controller_authority_held") == 1
    assert total("grid_controller_term", "grid_controller_term") >= 1
    assert (
        total("grid_controller_lease_remaining_seconds", "grid_controller_lease_remaining_seconds")
        > 0
    )
    assert (
        total(
            "grid_controller_tick_duration_seconds", "grid_controller_tick_duration_seconds_count"
        )
        >= 1
    )
    for m in (baseline, cold):
        assert total("grid_model_ready_replicas", "grid_model_ready_replicas", model=m) >= 1
        assert total("grid_model_desired_replicas", "grid_model_desired_replicas", model=m) >= 1
    assert (
        total(
            "grid_controller_actions",
            "grid_controller_actions_total",
            kind="warm",
            status="succeeded",
        )
        >= 2
    )
    assert (
        total("grid_router_requests", "grid_router_requests_total", model=cold, outcome="ok") >= 1
    )
    assert (
        total(
            "grid_router_retry_after_responses",
            "grid_router_retry_after_responses_total",
            model=cold,
        )
        >= 1
    )
    assert (
        total(
            "grid_router_upstream_latency_seconds",
            "grid_router_upstream_latency_seconds_count",
            model=cold,
        )
        >= 1
    )
    for h in hosts:
        age = total("grid_node_heartbeat_age_seconds", "grid_node_heartbeat_age_seconds", host=h)
        assert 0 <= age < 90
        assert total("grid_node_protection_state", "grid_node_protection_state", host=h) == 1
        assert total(
            "grid_node_memory_bytes", "grid_node_memory_bytes", host=h, kind="capacity"
        ) == (3 * 1024 * 2**20)
    assert (
        total("grid_node_residency_state", "grid_node_residency_state", model=cold, state="ready")
        >= 1
    )


def _kill_switch(driver: WebDriver, home: Path) -> None:
    """Without the token the switch is disabled; with it, a confirmed click sets recommend."""
    button = driver.find_element(By.ID, "kill-switch")
    assert not button.is_enabled()
    token = (home / "fleet" / "server" / "operator-token").read_text().strip()
    driver.find_element(By.ID, "token").send_keys(token)
    assert button.is_enabled()
    button.click()
    WebDriverWait(driver, 10).until(lambda d: d.switch_to.alert)
    alert = driver.switch_to.alert
    assert "Kill switch" in alert.text
    alert.accept()
    wait_for(
        driver,
        "mode recommend",
        lambda d: attr(d, "mode", "data-mode") == "recommend",
        30.0,
    )
