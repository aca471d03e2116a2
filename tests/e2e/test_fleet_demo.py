"""The logical fleet end to end: real server, real node agents, real llama-server children.

One two-host fleet is started through the shipped CLI (``grid test start``) for the whole
module; the tests use it as an operator would (status, idempotent start, the official
``openai`` client, the shortened self-checking demo) and the teardown stops it and proves
from the process table that nothing it started is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fleet_cli import default_sigint, grid, owned
from ports import port

from grid_core.system import is_gone, same_birth, wait_until_sync

pytestmark = pytest.mark.e2e

ENGINE_PORT_BASE = port(23100)
"""Engine ports for this module's fleet: clear of the default range and the other e2e tests."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict]]:
    home = tmp_path_factory.mktemp("fleet-home")
    started = grid(
        home,
        "test",
        "start",
        "--machines",
        "2",
        "--text-capacities-gib",
        "3,3",
        "--port",
        "0",
        "--engine-port-base",
        str(ENGINE_PORT_BASE),
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        doc = json.loads(grid(home, "test", "status", "--json").stdout)
        yield home, doc
    finally:
        before = [(p.pid, p.create_time()) for p in owned(home)]
        stopped = grid(home, "test", "stop")
        left = [pid for pid, born in before if same_birth(pid, born) and not is_gone(pid)]
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        # The kill switch comes first, then each host reports one readable line.
        assert stopped.stdout.index("allocator mode: recommend") < stopped.stdout.index("host-01")
        assert "host-01: agent pid" in stopped.stdout and "drained and stopped" in stopped.stdout
        assert before, "the fleet started no process at all"
        assert not left, f"processes left after 'grid test stop': {left}"
        assert not owned(home)


def test_each_logical_host_has_its_own_identity_share_ports_and_credential(fleet):
    home, doc = fleet
    hosts = doc["hosts"]
    assert [h["host_id"] for h in hosts] == ["host-01", "host-02"]
    assert len({h["failure_domain"] for h in hosts}) == 2
    assert hosts[0]["port_high"] < hosts[1]["port_low"]
    assert all(h["capacity_mb"] == 3 * 1024 and h["agent_running"] for h in hosts)
    for h in hosts:
        token = home / "fleet" / "tokens" / f"{h['host_id']}.token"
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        state = home / "fleet" / "hosts" / h["host_id"]
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
    registered = {
        n["host_id"] for n in doc["allocator"]["server"]["nodes"] if n["role"] == "allocator"
    }
    assert registered == {"host-01", "host-02"}
    sizes = [Path(m["path"]).stat().st_size for m in doc["models"]]
    assert len(set(sizes)) == 3, "the three default models must differ in size"
    assert sorted(m["min_replicas"] for m in doc["models"]) == [0, 0, 1]
    assert len({m["priority"] for m in doc["models"]}) == 3
    # The logs explain what the fleet did: the server says which warm it issued and why, the
    # agent that ran it says so; the named grid lets a bare --grid URL find the token.
    baseline = next(m["model_id"] for m in doc["models"] if m["min_replicas"] == 1)
    server_log = (home / "fleet" / "server.log").read_text()
    assert f"issued warm {baseline} on host-0" in server_log, server_log[-2000:]
    agent_logs = "".join(
        (home / "fleet" / "hosts" / h["host_id"] / "agent.log").read_text() for h in hosts
    )
    assert f"executing warm {baseline}" in agent_logs, agent_logs[-2000:]
    grids = json.loads((home / "grids.json").read_text())
    assert grids["grids"]["test-fleet"]["url"] == doc["url"]


def test_start_is_idempotent_and_refuses_conflicting_settings(fleet):
    home, doc = fleet
    again = grid(
        home,
        "test",
        "start",
        "--machines",
        "2",
        "--text-capacities-gib",
        "3,3",
        "--port",
        "0",
        "--engine-port-base",
        str(ENGINE_PORT_BASE),
    )
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stdout
    # Flags left out keep the running fleet's values: the bare command confirms it too.
    bare = grid(home, "test", "start")
    assert bare.returncode == 0, bare.stderr
    assert "already running" in bare.stdout
    other = grid(
        home,
        "test",
        "start",
        "--machines",
        "2",
        "--text-capacities-gib",
        "3,2",
        "--port",
        "0",
        "--engine-port-base",
        str(ENGINE_PORT_BASE),
    )
    assert other.returncode == 2, other.stderr  # the operator's settings must change
    assert "(--text-capacities-gib): running 3,3, asked 3,2" in other.stderr
    assert "grid test stop" in other.stderr
    still = json.loads(grid(home, "test", "status", "--json").stdout)
    assert still["server_pid"] == doc["server_pid"] and still["running"]


def test_official_openai_client_lists_models_and_streams_a_completion(fleet):
    _home, doc = fleet
    with openai.OpenAI(base_url=doc["url"] + "/v1", api_key="unused", max_retries=0) as client:
        ids = [m.id for m in client.models.list()]
        baseline = next(m["model_id"] for m in doc["models"] if m["min_replicas"] == 1)
        assert baseline in ids
        chunks = list(
            client.chat.completions.create(
                model=baseline,
                stream=True,
                max_tokens=8,
                messages=[{"role": "user", "content": "Reply with OK"}],
                extra_body={"ignore_eos": True},
            )
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert len({c.id for c in chunks}) == 1


def test_shortened_demo_passes_every_phase_with_real_requests(fleet):
    home, _doc = fleet
    run = grid(home, "test", "demo", "--users", "3", "--requests", "6", "--max-tokens", "8")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    for phase in "abcde":
        assert f"phase ({phase}) passed" in out, out[-4000:]
    assert "503 with Retry-After" in out
    assert "preempted" in out and "drained before unload" in out
    assert "command drain (eviction)" in out and "command unload (eviction)" in out
    # Each phase's own line and its row in the final table count the same requests.
    lines = dict(re.findall(r"phase \((\w)\) passed in [\d.]+ s: (\d+/\d+) answered", out))
    rows = dict(
        (m[0], f"{m[2]}/{m[1]}")
        for m in re.findall(r"^\s*(\w)\s+[\d.]+\s+(\d+)\s+(\d+)\s", run.stdout, re.M)
    )
    assert lines and lines == rows, (lines, rows)


def test_replaying_a_real_trace_serves_it_and_reports_the_fleet_over_time(fleet):
    home, doc = fleet
    trace = Path(__file__).resolve().parents[1] / "data" / "traces" / "azure_llm_2023_conv.csv"
    run = grid(
        home,
        "test",
        "replay",
        "--trace",
        str(trace),
        "--speedup",
        "10",
        "--duration",
        "30s",
        "--max-tokens",
        "8",
        "--json",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["requests"] > 50  # the trace's first 30 s, all of it
    assert report["served"] >= 0.95 * report["requests"], report["errors_sample"]
    assert (
        report["served"] + report["unavailable_503"] + report["other_errors"] == report["requests"]
    )
    assert "first_attempt_503s" in report and "retried_after_503" not in report
    assert report["completion_tokens"] > 0 and report["tokens_per_s"] > 0
    assert report["p50_ms"] <= report["p95_ms"] <= report["p99_ms"]
    baseline = next(m["model_id"] for m in doc["models"] if m["min_replicas"] == 1)
    assert set(report["per_model"]) == {baseline}
    assert report["replicas_over_time"] and all(
        s["ready"].get(baseline, 0) >= 1 for s in report["replicas_over_time"]
    )


def test_watch_follows_a_load_and_ctrl_c_stops_only_the_watch(fleet):
    home, doc = fleet
    high = max(doc["models"], key=lambda m: m["priority"])["model_id"]
    env = dict(os.environ, GRID_HOME=str(home), PYTHONUNBUFFERED="1")
    watch = subprocess.Popen(
        [sys.executable, "-c", "from grid_core.cli import main; main()", "test", "watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=default_sigint,  # Ctrl-C must reach the watch (see default_sigint)
    )
    lines: list[str] = []
    try:
        assert watch.stdout is not None
        lines.append(watch.stdout.readline())  # the banner comes right before the first read
        assert "watching" in lines[0], lines
        time.sleep(1.5)  # the first status read (the snapshot) is done: what follows is news
        with httpx.Client(timeout=120.0, trust_env=False) as client:
            body = {
                "model": high,
                "max_tokens": 4,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": "hello"}],
            }
            url = doc["url"] + "/v1/chat/completions"
            if not wait_until_sync(
                lambda: client.post(url, json=body).status_code == 200,
                timeout_s=120.0,
                interval_s=1.0,
            ):
                pytest.fail(f"{high} was never loaded for a real request")
        time.sleep(2.0)  # a few status reads after the load
    finally:
        watch.send_signal(signal.SIGINT)
        try:
            rest, _ = watch.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            watch.kill()  # our own child, by its Popen handle: never left running
            rest, _ = watch.communicate(timeout=10)
            pytest.fail(f"grid test watch ignored Ctrl-C for 30 s: {''.join(lines) + rest}")
        out = "".join(lines) + rest
    assert watch.returncode == 0, out
    assert f"{high}" in out and "-> ready" in out, out
    assert "command warm" in out
    assert "the fleet is still running" in out
    assert json.loads(grid(home, "test", "status", "--json").stdout)["running"]
