"""The operator CLI against a real server: profiles, modes, status, tokens, up/down."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import psutil
import pytest
from loopback_http import serving
from server_testbed import Engine, Grid, host_with_cached_model, serve_model

from grid_core.wire import control_record_id

pytestmark = pytest.mark.integration


@pytest.fixture
def grid(grid_process: Grid) -> Grid:
    """The CLI is a separate process: it needs the server listening on a real port."""
    return grid_process


GRID_BIN = Path(sys.executable).parent / "grid"
"""The installed console script (the real entry point an operator runs)."""


def grid_cli(
    *args: str,
    home: Path,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GRID_ALLOCATOR")}
    full["GRID_HOME"] = str(home)
    full.update(env or {})
    return subprocess.run(
        [str(GRID_BIN), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


def run(grid: Grid, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return grid_cli(*args, "--grid", grid.url, home=grid.home, **kw)  # type: ignore[arg-type]


def test_profile_mode_tick_and_status(grid: Grid) -> None:
    r = run(
        grid,
        "allocator",
        "model",
        "set",
        "qwen.gguf",
        "--memory-mb",
        "12000",
        "--runtime-memory-mb",
        "llama.cpp=11000",
        "--workload-score",
        "coding=1",
        "--workload-score",
        "research=.8",
        "--max-replicas",
        "3",
        "--pin",
        "h1",
    )
    assert r.returncode == 0, r.stderr
    r = run(grid, "allocator", "mode", "observe")
    assert r.returncode == 0 and "observe" in r.stdout
    assert run(grid, "allocator", "tick").returncode == 0
    table = run(grid, "allocator", "status")
    assert table.returncode == 0
    assert "mode: observe" in table.stdout and "qwen.gguf" in table.stdout
    doc = json.loads(run(grid, "allocator", "status", "--json").stdout)
    (profile,) = doc["controller"]["profiles"]
    assert profile["runtime_memory_mb"] == {"llama.cpp": 11000}
    assert profile["workload_scores"] == {"coding": 1.0, "research": 0.8}
    # model show: every field, the changed ones marked, and the version an edit writes over.
    shown = run(grid, "allocator", "model", "show", "qwen.gguf")
    assert shown.returncode == 0, shown.stderr
    version = grid.http.get(grid.url + "/allocator/models/qwen.gguf").json()["version"]
    assert f"version {version}" in shown.stdout
    lines = {line.split()[0]: line for line in shown.stdout.splitlines() if line.strip()}
    assert "*" in lines["max_replicas"] and "3" in lines["max_replicas"]
    assert "h1" in lines["pins"] and "*" not in lines["min_replicas"]
    raw = json.loads(run(grid, "allocator", "model", "show", "qwen.gguf", "--json").stdout)
    assert raw["version"] == version and raw["profile"]["max_replicas"] == 3
    # Default values are spelled out too, as in the table (the server's document omits them).
    assert raw["profile"]["min_replicas"] == 0 and set(raw["profile"]) <= set(lines)
    assert raw["profile"]["artifact_source"] is None and raw["profile"]["pins"] == ["h1"]
    missing = run(grid, "allocator", "model", "show", "nope.gguf")
    assert missing.returncode == 2 and "no profile" in missing.stderr
    assert run(grid, "allocator", "model", "rm", "qwen.gguf").returncode == 0
    doc = json.loads(run(grid, "allocator", "status", "--json").stdout)
    assert doc["server"]["profiles"] == []


@pytest.mark.parametrize(
    "args",
    [
        ("allocator", "model", "set", "m", "--memory-mb", "0"),
        ("allocator", "model", "set", "m", "--memory-mb", "10", "--workload-score", "coding=2"),
        ("allocator", "model", "set", "m", "--memory-mb", "10", "--runtime-memory-mb", "nope"),
        ("allocator", "mode", "turbo"),
        ("allocator", "model", "set", "m", "--memory-mb", "10", "--workload-score", "nonsense=.5"),
        ("allocator", "model", "set", "m", "--memory-mb", "10", "--runtime", "bog/us"),
        ("allocator", "model", "set", "m", "--max-replicas", "2"),  # new profile needs memory
    ],
)
def test_bad_operator_input_exits_2_with_one_line(grid: Grid, args: tuple[str, ...]) -> None:
    r = run(grid, *args)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 or "Usage" in r.stderr
    status = json.loads(run(grid, "allocator", "status", "--json").stdout)
    assert status["server"]["profiles"] == [] and status["mode"] == "recommend"


def _profile(grid: Grid, model_id: str) -> dict[str, object]:
    doc = json.loads(run(grid, "allocator", "status", "--json").stdout)
    (profile,) = [p for p in doc["controller"]["profiles"] if p["model_id"] == model_id]
    return profile


def test_model_set_changes_only_the_given_fields_and_says_what_changed(grid: Grid) -> None:
    sha = "ab" * 32
    r = run(
        grid,
        *("allocator", "model", "set", "m", "--memory-mb", "12000", "--min-replicas", "1"),
        *("--max-replicas", "3", "--priority", "7", "--artifact-sha256", sha),
        *("--min-residency-s", "60", "--scale-down-cooldown-s", "90"),
    )
    assert r.returncode == 0, r.stderr
    assert "created" in r.stdout and "max_replicas: 1 → 3" in r.stdout
    assert "memory_mb: - → " in r.stdout and "memory_mb: 0 →" not in r.stdout  # no default
    r = run(grid, "allocator", "model", "set", "m", "--memory-mb", "1000")
    assert r.returncode == 0, r.stderr
    assert "memory_mb: 12000 → 1000" in r.stdout
    assert len(r.stdout.strip().splitlines()) == 2  # the summary and the one changed field
    profile = _profile(grid, "m")
    assert profile["memory_mb"] == 1000
    assert (profile["min_replicas"], profile["max_replicas"], profile["priority"]) == (1, 3, 7)
    assert profile["artifact_sha256"] == sha
    assert (profile["min_residency_s"], profile["scale_down_cooldown_s"]) == (60.0, 90.0)
    r = run(grid, "allocator", "model", "set", "m", "--memory-mb", "1000")
    assert r.returncode == 0 and "unchanged" in r.stdout
    r = run(grid, "allocator", "model", "set", "m", "--memory-mb", "2000", "--replace")
    assert r.returncode == 0, r.stderr
    assert "replaced" in r.stdout and "priority: 7 → 0" in r.stdout
    assert "max_replicas: 3 → 1" in r.stdout
    profile = _profile(grid, "m")
    assert profile["memory_mb"] == 2000 and "priority" not in profile  # back to the default
    assert run(grid, "allocator", "model", "set", "m", "--replace").returncode == 2


def test_profile_put_refuses_unknown_fields_runtimes_and_workloads(grid: Grid) -> None:
    url = grid.url + "/allocator/models/m"
    for body, named in (
        ({"memory_mb": 10, "max_replica": 3}, "max_replica"),
        ({"memory_mb": 10, "runtimes": ["bog us"]}, "vllm"),
        ({"memory_mb": 10, "workload_scores": {"nonsense": 0.5}}, "coding"),
    ):
        resp = grid.http.put(url, json=body, headers=grid.operator())
        assert resp.status_code == 400, resp.text
        assert named in resp.json()["error"]["message"]
    assert grid.http.get(url).status_code == 404  # nothing was stored


def test_wrong_token_file_and_env_are_refused(grid: Grid, tmp_path: Path) -> None:
    bad = tmp_path / "bad-token"
    bad.write_text("wrong\n")
    bad.chmod(0o600)
    r = run(grid, "allocator", "mode", "observe", "--token-file", str(bad))
    assert r.returncode == 1 and "401" in r.stderr
    r = run(grid, "allocator", "tick", env={"GRID_ALLOCATOR_CONTROL_TOKEN": "wrong"})
    assert r.returncode == 1
    good = tmp_path / "good-token"
    good.write_text(grid.operator_token)
    good.chmod(0o600)
    empty_home = tmp_path / "empty-home"
    r = grid_cli(
        "allocator", "tick", "--grid", grid.url, "--token-file", str(good), home=empty_home
    )
    assert r.returncode == 0, r.stderr


def test_token_write_is_owner_only_and_prints_no_secret(grid: Grid, tmp_path: Path) -> None:
    target = tmp_path / "node-token"
    r = run(grid, "allocator", "token", "write", str(target))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    doc = json.loads(target.read_text())
    assert doc["host_id"] in r.stdout  # generated id printed once
    assert r.stdout.count(doc["host_id"]) == 1
    assert doc["token"] not in r.stdout + r.stderr
    assert grid.register_host(doc["token"], doc["host_id"]).host_id == doc["host_id"]
    named = tmp_path / "named-token"
    r = run(grid, "allocator", "token", "write", str(named), "--host-id", "host-mac")
    assert r.returncode == 0 and "generated" not in r.stdout
    assert json.loads(named.read_text())["host_id"] == "host-mac"
    nodes = grid.http.get(grid.url + "/nodes").json()["nodes"]
    assert [n["node_id"] for n in nodes] == [control_record_id(doc["host_id"])]


def test_models_and_chat(grid: Grid, engines: Callable[[str], Engine]) -> None:
    eng = engines("m-cli")
    serve_model(grid, eng, "host-c")
    r = run(grid, "models")
    assert r.returncode == 0 and r.stdout.split() == ["m-cli"]
    r = run(grid, "chat", "-m", "m-cli", "--max-tokens", "3", "hello there")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["tok0", "tok1", "tok2"]
    assert "answered by" not in r.stderr  # the caller named the model
    r = run(grid, "chat", "-m", "auto", "--max-tokens", "2", "hello there")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["tok0", "tok1"]
    assert "grid: auto was answered by m-cli" in r.stderr  # Grid chose: say which model
    r = run(grid, "chat", "-m", "unknown-model", "hi")
    assert r.returncode == 2 and "404" in r.stderr


def test_chat_shows_control_characters_in_a_reply_harmlessly(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    """A reply that carries terminal escapes (clear screen, retitle, carriage return) is shown
    with those characters replaced, so a model cannot rewrite the operator's terminal."""
    eng = engines("m-esc")
    serve_model(grid, eng, "host-e")
    eng.behave(word="\x1b[2J\x1b]0;owned\x07\r\x9bw")
    r = run(grid, "chat", "-m", "m-esc", "--max-tokens", "2", "hi")
    assert r.returncode == 0, r.stderr
    assert not any(ch in r.stdout for ch in "\x1b\x07\r\x9b"), repr(r.stdout)
    assert r.stdout.split() == [
        "\ufffd[2J\ufffd]0;owned\ufffd\ufffd\ufffdw0",
        "\ufffd[2J\ufffd]0;owned\ufffd\ufffd\ufffdw1",
    ]


def test_chat_waits_for_a_starting_model_and_then_answers(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    # A profile and no engine yet: the router answers 503 with Retry-After.
    grid.http.put(
        f"{grid.url}/allocator/models/m-later",
        json={"memory_mb": 1000},
        headers=grid.operator(),
    ).raise_for_status()
    once = run(grid, "chat", "-m", "m-later", "--wait", "0", "hi")
    assert once.returncode == 1 and "503" in once.stderr and "no ready engine" in once.stderr
    assert "trying again" not in once.stderr
    full = {k: v for k, v in os.environ.items() if not k.startswith("GRID_ALLOCATOR")}
    full["GRID_HOME"] = str(grid.home)
    waiting = subprocess.Popen(
        [str(GRID_BIN), "chat", "-m", "m-later", "--max-tokens", "3", "--grid", grid.url, "hi"],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with waiting:  # closes its pipes whatever happens
        try:
            assert waiting.stderr is not None
            first = waiting.stderr.readline()  # the command says it waits before it retries
            assert "no ready engine" in first and "trying again in" in first, first
            serve_model(grid, engines("m-later"), "host-later")
            out, err = waiting.communicate(timeout=120)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.communicate()
    assert waiting.returncode == 0, err
    assert out.split() == ["tok0", "tok1", "tok2"]
    # It noticed the model listed ready and retried then, not after its whole pause.
    assert "m-later is ready; trying again now" in err, first + err


def test_chat_waits_out_the_pause_when_a_listed_model_cannot_answer(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    """A 503 for a model that is listed ready (here its engine refuses connections; every
    engine busy is the same) is not something a listing can end early: the command waits out
    the advised pause instead of saying the model is ready and retrying every poll."""
    eng = engines("m-gone")
    serve_model(grid, eng, "host-1")
    eng.child.stop()
    listed = grid.http.get(grid.url + "/v1/models").json()["data"]
    assert "m-gone" in {m["id"] for m in listed}
    r = run(grid, "chat", "-m", "m-gone", "--wait", "3", "hi")
    assert r.returncode == 1, r.stderr
    assert "accepted a connection" in r.stderr and "gave up after --wait 3 s" in r.stderr
    assert "is ready" not in r.stderr
    assert "trying again in" in r.stderr.splitlines()[0], r.stderr


def test_chat_gives_up_after_its_wait(grid: Grid) -> None:
    grid.http.put(
        f"{grid.url}/allocator/models/m-never",
        json={"memory_mb": 1000},
        headers=grid.operator(),
    ).raise_for_status()
    r = run(grid, "chat", "-m", "m-never", "--wait", "1", "hi")
    assert r.returncode == 1
    assert "trying again in" in r.stderr and "gave up after --wait 1 s" in r.stderr


def test_chat_does_not_wait_for_a_model_no_host_can_run(grid: Grid) -> None:
    """Waiting cannot start a model whose runtime no registered host offers: the command
    says why at once instead of retrying for its whole --wait."""
    host_with_cached_model(grid, "host-1", "m-base", "a" * 64)
    grid.client.put_model("m-vllm", {"memory_mb": 1000, "min_replicas": 1, "runtimes": ["vllm"]})
    grid.http.post(grid.url + "/allocator/tick", headers=grid.operator()).raise_for_status()
    r = run(grid, "chat", "-m", "m-vllm", "--wait", "600", "hi")
    assert r.returncode == 1, r.stderr
    assert "cannot be placed on any host" in r.stderr and "vllm" in r.stderr
    assert "trying again" not in r.stderr  # it never paused to retry


class _NewerServer(BaseHTTPRequestHandler):
    """A server one release ahead: its profile has a field this CLI does not know."""

    def do_GET(self) -> None:
        body = json.dumps(
            {"profile": {"model_id": "m", "memory_mb": 5, "gpu_vendor": "amd"}, "version": "v7"}
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_model_show_json_keeps_what_a_newer_server_sent(tmp_path: Path) -> None:
    """``model show --json`` fills in the defaults this CLI knows, and drops nothing the
    server sent (a field only a newer server knows stays)."""
    with serving(_NewerServer) as url:
        r = grid_cli("allocator", "model", "show", "m", "--json", "--grid", url, home=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["version"] == "v7" and doc["profile"]["gpu_vendor"] == "amd"
    assert doc["profile"]["memory_mb"] == 5 and doc["profile"]["max_replicas"] == 1


def test_no_server_is_one_line_exit_1(tmp_path: Path) -> None:
    r = grid_cli("models", "--grid", "http://127.0.0.1:9", home=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip().startswith("grid: error:") and len(r.stderr.strip().splitlines()) == 1


def test_detached_server_runs_the_installed_grid_not_a_copy_in_the_working_directory(
    tmp_path: Path,
) -> None:
    """``grid up --detach`` started from a directory that holds another ``grid_server`` (an
    old checkout, say) still runs the installed server: the working directory is not on the
    daemon's import path."""
    decoy = tmp_path / "checkout"
    (decoy / "grid_server").mkdir(parents=True)
    (decoy / "grid_server" / "__init__.py").write_text("raise SystemExit('decoy grid_server')\n")
    home = tmp_path / "home"
    r = grid_cli("up", "--detach", "--port", "0", home=home, cwd=decoy)
    try:
        assert r.returncode == 0, r.stderr
        assert "decoy" not in r.stderr
        assert grid_cli("allocator", "status", home=home).returncode == 0
    finally:
        if (home / "server.json").exists():
            assert grid_cli("down", home=home).returncode == 0


def test_up_detach_and_down_stop_only_that_server(tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = grid_cli("up", "--detach", "--port", "0", home=home)
    assert r.returncode == 0, r.stderr
    rec = json.loads((home / "server.json").read_text())
    proc = psutil.Process(rec["pid"])
    try:  # from here a failed assertion still stops the server this test started
        assert "warning" not in r.stderr  # loopback is the safe default: nothing to warn about
        assert "grid: planner build: native: mypyc build in " in r.stdout
        shown = grid_cli("allocator", "status", "--json", home=home)
        assert shown.returncode == 0
        # the server plans with the native build `make test` made (docs/planner.md)
        build = json.loads(shown.stdout)["server"]["planner_build"]
        assert build["native"] is True, build["reason"]
        again = grid_cli("up", "--detach", "--port", "0", home=home)
        assert again.returncode == 1 and "already running" in again.stderr
        # The record names the server's store: a copy from it is refused, one from another
        # directory's file store gets past that check (and fails on the unreachable etcd).
        assert rec["state_store"]["kind"] == "file"
        assert rec["state_store"]["path"] == str((home / "state" / "controller.json").resolve())
        to_etcd = ("allocator", "state", "copy", "--to", "etcd://127.0.0.1:9/x", "--from", "file")
        refused = grid_cli(*to_etcd, home=home)
        assert refused.returncode == 2 and "uses the --from store" in refused.stderr
        elsewhere = grid_cli(*to_etcd, "--state-dir", str(tmp_path / "other"), home=home)
        assert "a Grid server is running" not in elsewhere.stderr, elsewhere.stderr
        r = grid_cli("down", home=home)
        assert r.returncode == 0, r.stderr
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        assert not (home / "server.json").exists()
        assert "no local server" in grid_cli("down", home=home).stdout
    finally:
        if proc.is_running():
            proc.terminate()
            proc.wait(10)


def test_up_passes_the_registration_grace_to_the_server_and_refuses_nonsense(
    tmp_path: Path,
) -> None:
    """``grid up --registration-grace S`` reaches the detached server; a negative, endless or
    over-an-hour grace is refused (it would hide a model no host can run for good)."""
    home = tmp_path / "home"
    for bad in ("-1", "inf", "3601"):
        r = grid_cli("up", "--detach", "--port", "0", "--registration-grace", bad, home=home)
        assert r.returncode == 2 and "--registration-grace" in r.stderr, r.stderr
        served = subprocess.run(
            [sys.executable, "-m", "grid_server.serve", "--port", "0", "--registration-grace", bad],
            env={**os.environ, "GRID_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert served.returncode == 2 and "give seconds from 0 to 3600" in served.stderr
    assert not (home / "server.json").exists()
    r = grid_cli("up", "--detach", "--port", "0", "--registration-grace", "0", home=home)
    assert r.returncode == 0, r.stderr
    proc = psutil.Process(json.loads((home / "server.json").read_text())["pid"])
    try:
        argv = proc.cmdline()
        assert argv[argv.index("--registration-grace") + 1] == "0.0"
    finally:
        assert grid_cli("down", home=home).returncode == 0


def test_down_refuses_an_unproven_pid(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (home / "server.json").write_text(
            json.dumps(
                {
                    "url": "http://127.0.0.1:1",
                    "pid": sleeper.pid,
                    "create_time": psutil.Process(sleeper.pid).create_time(),
                }
            )
        )
        r = grid_cli("down", home=home)
        assert r.returncode == 1 and "not provably" in r.stderr
        time.sleep(0.2)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_down_stops_a_foreground_grid_up(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_ALLOCATOR")}
    env["GRID_HOME"] = str(home)
    fg = subprocess.Popen(
        [str(GRID_BIN), "up", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert fg.stdout is not None
        assert "serving on" in fg.stdout.readline()
        r = grid_cli("down", home=home)
        assert r.returncode == 0, r.stderr
        fg.wait(20)
        assert not (home / "server.json").exists()
    finally:
        if fg.poll() is None:
            fg.kill()
            fg.wait()
        if fg.stdout is not None:
            fg.stdout.close()


@pytest.mark.parametrize("args", [("up", "--port", "99999"), ("up", "--detach", "--port", "-1")])
def test_up_refuses_an_out_of_range_port_in_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    home = tmp_path / "home"
    r = grid_cli(*args, home=home)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert "1-65535" in r.stderr and "Traceback" not in r.stderr
    assert not (home / "server.json").exists()


def test_foreground_server_refuses_an_out_of_range_port(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "grid_server.serve", "--port", "65536"],
        env={**os.environ, "GRID_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2 and "1-65535" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("secret", ["operator-token", "signing-key"])
def test_up_detach_with_a_readable_secret_says_why_in_one_line(tmp_path: Path, secret: str) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / secret).write_text("s3cret-value\n")
    (home / secret).chmod(0o644)
    (home / "server.log").write_text("an older run's last line\n")
    r = grid_cli("up", "--detach", "--port", "0", home=home)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert f"chmod 600 {home / secret}" in r.stderr
    assert "older run" not in r.stderr and "s3cret-value" not in r.stderr
    assert "Traceback" not in (home / "server.log").read_text()
    assert not (home / "server.json").exists()


@pytest.mark.parametrize("detach", [False, True])
def test_up_with_a_missing_policy_file_is_a_usage_error_in_both_modes(
    tmp_path: Path, detach: bool
) -> None:
    home = tmp_path / "home"
    missing = tmp_path / "no-policy.json"
    r = grid_cli(
        "up", "--port", "0", "--policy", str(missing), *(["--detach"] if detach else []), home=home
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert f"--policy {missing}" in r.stderr and "give a JSON ControllerPolicy" in r.stderr
    assert not (home / "server.json").exists()


@pytest.mark.parametrize("detach", [False, True])
def test_up_with_a_state_dir_it_cannot_create_names_the_directory(
    tmp_path: Path, detach: bool
) -> None:
    # A regular file where the directory's parent should be: mkdir fails (not a directory).
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    home = tmp_path / "home"
    args = ["up", "--port", "0", "--state-dir", str(blocker / "state")]
    r = grid_cli(*args, *(["--detach"] if detach else []), home=home)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert f"controller state directory {blocker / 'state'}" in r.stderr
    assert "cannot listen" not in r.stderr and "Traceback" not in r.stderr
    assert not (home / "server.json").exists()


def test_up_with_a_grid_home_it_cannot_create_says_so_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = grid_cli("up", "--port", "0", home=blocker / "home")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"grid: error: cannot create the Grid home {blocker / 'home'}: Not a directory; "
        "point GRID_HOME at a directory you can write"
    ]


@pytest.mark.parametrize("detach", [False, True])
def test_up_on_a_non_loopback_address_warns_about_the_exposure(
    tmp_path: Path, detach: bool
) -> None:
    # 192.0.2.1 (TEST-NET-1) is never assigned here, so the bind fails after the warning and
    # nothing is ever exposed by this test.
    args = ["up", "--host", "192.0.2.1", "--port", "0"] + (["--detach"] if detach else [])
    r = grid_cli(*args, home=tmp_path / "home")
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("grid: warning: --host 192.0.2.1")
    assert "other machines can reach" in lines[0]
    assert r.returncode == 1 and "cannot listen" in r.stderr


def test_a_token_file_others_can_read_is_refused(grid: Grid, tmp_path: Path) -> None:
    shared = tmp_path / "shared-token"
    shared.write_text(grid.operator_token)
    shared.chmod(0o644)
    r = run(grid, "allocator", "mode", "observe", "--token-file", str(shared))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"grid: error: {shared} is readable by other "
        f"users (mode 644); run 'chmod 600 {shared}' and retry"
    ]
    status = json.loads(run(grid, "allocator", "status", "--json").stdout)
    assert status["mode"] == "recommend"  # nothing was sent
    shared.chmod(0o600)
    assert run(grid, "allocator", "mode", "observe", "--token-file", str(shared)).returncode == 0


def test_token_write_keeps_an_existing_credential_unless_forced(grid: Grid, tmp_path: Path) -> None:
    target = tmp_path / "node-token"
    assert run(grid, "allocator", "token", "write", str(target)).returncode == 0
    first = target.read_text()
    r = run(grid, "allocator", "token", "write", str(target), "--host-id", "other")
    assert r.returncode == 2 and "--force" in r.stderr
    assert target.read_text() == first
    r = run(grid, "allocator", "token", "write", str(target), "--host-id", "other", "--force")
    assert r.returncode == 0, r.stderr
    assert json.loads(target.read_text())["host_id"] == "other"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_exit_codes_separate_operator_input_from_environment_failures(
    grid: Grid, tmp_path: Path
) -> None:
    r = run(grid, "allocator", "model", "remove", "unknown")
    assert r.returncode == 2 and "404" in r.stderr  # the operator named a model with no profile
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-capability\n")
    wrong.chmod(0o600)
    r = run(grid, "allocator", "model", "remove", "unknown", "--token-file", str(wrong))
    assert r.returncode == 1 and "401" in r.stderr  # the credential was refused
    r = run(grid, "allocator", "tick", "--token-file", str(tmp_path / "missing"))
    assert r.returncode == 2 and "missing" in r.stderr
    r = grid_cli("allocator", "tick", "--grid", grid.url, home=tmp_path / "no-home")
    assert r.returncode == 2 and "--token-file" in r.stderr  # no capability anywhere


def test_model_set_accepts_a_runtime_plugins_name(grid: Grid) -> None:
    # The plugin how-to's own command: a third-party runtime name is a valid profile.
    r = run(
        grid, "allocator", "model", "set", "echo-model", "--memory-mb", "100", "--runtime", "echo"
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(run(grid, "allocator", "status", "--json").stdout)
    assert [p["runtimes"] for p in doc["controller"]["profiles"]] == [["echo"]]
