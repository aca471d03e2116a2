"""Logical fleet pieces that need no process: shares, hosts, model budgets, trace parsing,
transition detection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fleet_records import saved_fleet
from grid_fleet import layout, observe, replay
from grid_fleet.layout import FleetRecord, FleetSettings, ModelSpec
from hypothesis import given
from hypothesis import strategies as st

from grid_core.errors import ValidationError
from grid_core.planner.types import ADMISSION_HEADROOM_MB

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


def test_equal_split_partitions_usable_memory(usable):
    caps = layout.plan_capacities(4, None)
    assert caps == (5000,) * 4 and sum(caps) <= usable


def test_explicit_capacities_must_fit_and_match_the_host_count(usable):
    assert layout.plan_capacities(3, "6,4,2") == (6144, 4096, 2048)
    with pytest.raises(ValidationError, match="can give only"):
        layout.plan_capacities(2, "12,12")
    with pytest.raises(ValidationError, match="one capacity per logical machine"):
        layout.plan_capacities(3, "4,4")
    with pytest.raises(ValidationError, match="less than"):
        layout.plan_capacities(2, "4,0.5")
    with pytest.raises(ValidationError, match="comma-separated"):
        layout.plan_capacities(2, "4,x")


@pytest.mark.parametrize("machines", [0, 33])
def test_machine_count_is_bounded(usable, machines):
    with pytest.raises(ValidationError, match=r"1\.\.32"):
        layout.plan_capacities(machines, None)


@given(st.integers(1, 32), st.integers(1024, 60000))
def test_hosts_get_distinct_ids_domains_and_disjoint_port_ranges(n, base):
    caps = (2048,) * n
    if base + n * layout.ENGINE_PORTS_PER_HOST - 1 > 65535:
        with pytest.raises(ValidationError):
            layout.host_specs(caps, base)
        return
    hosts = layout.host_specs(caps, base)
    assert len({h.host_id for h in hosts}) == n
    assert len({h.failure_domain for h in hosts}) == n
    ports = [p for h in hosts for p in range(h.port_low, h.port_high + 1)]
    assert len(ports) == len(set(ports)) and min(ports) == base


@given(st.integers(layout.MIN_HOST_MB * 3, 64_000), st.integers(0, 1_000))
def test_default_budgets_fill_a_host_with_exactly_one_replica(cap, external):
    """Any two default replicas exceed one host's whole share; each alone fits while other
    programs use up to 30 % of it (the fleet fills up, and preemption is really needed)."""
    budgets = [int(cap * float(m["share"])) for m in layout.DEFAULT_MODELS]
    assert all(a + b > cap for a in budgets for b in budgets)
    if external <= 0.3 * cap - ADMISSION_HEADROOM_MB:
        assert all(b <= cap - ADMISSION_HEADROOM_MB - external for b in budgets)


def _record(tmp_path: Path) -> FleetRecord:
    models = tuple(
        ModelSpec(
            model_id=f"{n}.gguf",
            path=str(tmp_path / n),
            sha256="0" * 64,
            memory_mb=100,
            priority=p,
            min_replicas=r,
            max_replicas=1,
        )
        for n, p, r in (("gen", 50, 1), ("cod", 10, 0), ("wri", 100, 0))
    )
    settings = FleetSettings(
        machines=1, port=0, engine_port_base=23000, capacities_mb=(2048,), models=()
    )
    return FleetRecord(settings=settings, url="http://127.0.0.1:1", hosts=(), models=models)


def test_trace_rows_become_arrivals_on_the_mapped_model(tmp_path):
    rec = _record(tmp_path)
    conv = replay.load_trace(TRACES / "azure_llm_2023_conv.csv", 60.0, {}, rec)
    code = replay.load_trace(TRACES / "azure_llm_2023_code.csv", 60.0, {}, rec)
    assert conv and all(a.model == "gen.gguf" and a.offset_s <= 60.0 for a in conv)
    assert code and all(a.model == "cod.gguf" for a in code)
    assert conv[0].offset_s == 0.0 and conv[0].context_tokens == 374
    mapped = replay.load_trace(TRACES / "azure_llm_2023_conv.csv", 5.0, {"conv": "wri.gguf"}, rec)
    assert {a.model for a in mapped} == {"wri.gguf"}
    with pytest.raises(ValidationError, match="not served"):
        replay.load_trace(TRACES / "azure_llm_2023_conv.csv", 5.0, {"conv": "nope"}, rec)


def test_a_malformed_trace_row_is_named(tmp_path):
    bad = tmp_path / "conv.csv"
    bad.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,2\nyesterday,3,4\n"
    )
    with pytest.raises(ValidationError, match="line 3"):
        replay.load_trace(bad, 60.0, {}, _record(tmp_path))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("600", 600.0), ("90s", 90.0), ("10m", 600.0), ("1h", 3600.0), ("2.5m", 150.0)],
)
def test_durations(text, seconds):
    assert replay.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-1m", "10 minutes", "m"])
def test_bad_durations(text):
    with pytest.raises(ValidationError):
        replay.parse_duration(text)


def _status(res: dict[str, list[tuple[str, str]]], history=()) -> dict:
    return {
        "controller": {
            "hosts": [
                {"host_id": h, "residencies": [{"model_id": m, "state": s} for m, s in rs]}
                for h, rs in res.items()
            ],
            "history": list(history),
        }
    }


def test_observer_reports_each_transition_and_command_outcome_once():
    obs = observe.Observer("http://x")
    first = obs.update(
        _status(
            {"h1": [("a", "ready"), ("b", "cached")]},
            [
                {
                    "action_id": "1",
                    "kind": "load",
                    "host_id": "h1",
                    "model_id": "a",
                    "status": "succeeded",
                }
            ],
        ),
        now=1.0,
    )
    assert [(e.model_id, e.before, e.after) for e in first] == [("a", "absent", "ready")]
    drain = {
        "action_id": "2",
        "kind": "drain",
        "host_id": "h1",
        "model_id": "a",
        "status": "delivered",
        "reason": "eviction",
    }
    evs = obs.update(_status({"h1": [("a", "draining"), ("b", "cached")]}, [drain]), now=2.0)
    assert {(e.kind, e.before, e.after) for e in evs} == {
        ("residency", "ready", "draining"),
        ("command", "new", "delivered"),
    }
    assert obs.update(_status({"h1": [("a", "draining"), ("b", "cached")]}, [drain])) == []
    gone = obs.update(_status({"h1": [("b", "cached")]}, [dict(drain, status="succeeded")]))
    assert {(e.kind, e.after) for e in gone} == {("residency", "absent"), ("command", "succeeded")}
    assert observe.ready_counts(_status({"h1": [("a", "ready")], "h2": [("a", "ready")]})) == {
        "a": 2
    }


def test_summary_counts_first_attempt_503s_not_retries():
    from grid_fleet import traffic

    outs = [
        traffic.Outcome(model="m", status=200, attempts=3, first_status=503, completion_tokens=4),
        traffic.Outcome(model="m", status=503, attempts=1, first_status=503, error="HTTP 503"),
        traffic.Outcome(model="m", status=200, attempts=1, first_status=200, completion_tokens=4),
    ]
    s = traffic.summarize(outs)
    assert s["first_attempt_503s"] == 2
    assert s["unavailable_503"] == 1 and s["served"] == 2
    assert "retried_after_503" not in s


def test_stop_of_hosts_that_never_started_reads_well(tmp_path):
    from grid_fleet import lifecycle

    root = tmp_path / "fleet"
    saved_fleet(root)
    lines: list[str] = []
    assert lifecycle.stop(lines.append, root) == []
    assert lines == ["  host-01: no agent was started", "  host-02: no agent was started"]
    assert not layout.record_path(root).exists()


def _gguf_bytes() -> bytes:
    return b"GGUF" + bytes(60)


def test_model_must_be_a_readable_gguf(tmp_path):
    from grid_fleet import models

    good = tmp_path / "ok.gguf"
    good.write_bytes(_gguf_bytes())
    models.check_gguf(good)
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model\n")
    with pytest.raises(ValidationError, match=r"fake\.gguf: not a GGUF file"):
        models.check_gguf(fake)
    with pytest.raises(ValidationError, match="no such file"):
        models.check_gguf(tmp_path / "missing.gguf")
    with pytest.raises(ValidationError, match="is a directory"):
        models.check_gguf(tmp_path)


def test_start_with_a_fake_model_is_one_line_exit_2_and_starts_nothing(
    tmp_path, monkeypatch, capsys
):
    from grid_core.cli import main

    monkeypatch.setenv("GRID_HOME", str(tmp_path / "home"))
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model\n")
    with pytest.raises(SystemExit) as exc:
        main(["test", "start", "--machines", "1", "--model", str(fake)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(fake) in err[0] and "GGUF" in err[0]
    assert not (tmp_path / "home" / "fleet" / "fleet.json").exists()


def test_a_failed_baseline_warm_is_read_from_the_allocator_status():
    from grid_fleet import lifecycle

    failed = {
        "action_id": "w1",
        "kind": "warm",
        "host_id": "host-01",
        "model_id": "base.gguf",
        "status": "failed",
        "message": "llama-server exited (1): invalid magic",
    }
    other = dict(failed, action_id="w2", model_id="optional.gguf")
    assert lifecycle.baseline_failure({}, {"base.gguf"}) is None
    assert lifecycle.baseline_failure({"controller": {"history": [other]}}, {"base.gguf"}) is None
    why = lifecycle.baseline_failure({"controller": {"history": [other, failed]}}, {"base.gguf"})
    assert why == "warm of base.gguf on host-01 failed: llama-server exited (1): invalid magic"
    res = {
        "controller": {
            "hosts": [
                {
                    "host_id": "host-02",
                    "residencies": [{"model_id": "base.gguf", "state": "failed"}],
                }
            ]
        }
    }
    assert "host-02" in (lifecycle.baseline_failure(res, {"base.gguf"}) or "")


def test_server_start_failure_quotes_only_this_runs_log(tmp_path):
    from grid_fleet import daemons

    root = tmp_path / "fleet"
    root.mkdir()
    (root / "server.log").write_text("STALE line from an earlier run\n" * 10)
    with pytest.raises(daemons.UnavailableError) as exc:
        daemons.start_server(root, 70000)  # out of range: the real server exits at once
    log = (root / "server.log").read_text()
    assert "STALE" not in log and "STALE" not in str(exc.value)
    assert log.strip() and str(exc.value).endswith(log.strip().splitlines()[-1])


def test_a_second_start_or_stop_is_refused_while_one_runs(tmp_path):
    import subprocess
    import sys

    from grid_fleet import lifecycle

    home = tmp_path / "home"
    root = home / "fleet"
    saved_fleet(root)
    with lifecycle.exclusive(root):
        done = subprocess.run(
            [sys.executable, "-c", "from grid_core.cli import main; main()", "test", "stop"],
            env={**__import__("os").environ, "GRID_HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"grid: error: another grid test start/stop is running on GRID_HOME={home}; "
        "wait for it to finish"
    )
    assert layout.record_path(root).exists()  # the refused stop touched nothing
    with lifecycle.exclusive(root):  # released again
        pass


def test_sigterm_during_start_becomes_a_handled_interrupt():
    import os
    import signal
    import time

    from grid_fleet import lifecycle

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(lifecycle.Terminated), lifecycle.sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # interrupted by the handler long before this ends
    assert signal.getsignal(signal.SIGTERM) is before
    assert lifecycle.Terminated.exit_code == 143


def test_refused_operator_token_names_the_fleet_token_file(tmp_path):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from grid_fleet import daemons

    from grid_core.client import Calls

    class Refuse(BaseHTTPRequestHandler):
        def do_PUT(self):
            body = b'{"detail": "use the token from $GRID_HOME/operator-token"}'
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    root = tmp_path / "fleet"
    (root / "server").mkdir(parents=True)
    daemons.token_path(root).write_text("wrong\n")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        with pytest.raises(daemons.UnavailableError) as exc:
            daemons.api(url, root, Calls.set_mode("recommend"))
    finally:
        srv.shutdown()
        srv.server_close()
        t.join()
    assert str(root / "server" / "operator-token") in str(exc.value)
    assert "$GRID_HOME/operator-token" not in str(exc.value)


def _demo():
    from grid_fleet.demo import Demo

    rec = _record(Path("/nonexistent"))
    caps = (2048, 2048)
    rec.hosts = layout.host_specs(caps, 30000)
    return Demo(rec, echo=lambda s: None)


def _ok(model: str) -> object:
    from grid_fleet import traffic

    return traffic.Outcome(model=model, status=200, first_status=200, completion_tokens=3)


def test_each_demo_phase_counts_exactly_the_answers_that_arrived_during_it():
    d = _demo()
    lines: list[str] = []
    d.echo = lines.append
    rep_c, started, _ = d._begin("c", "scale-out")
    for _ in range(3):
        d._record(_ok("gen.gguf"))
    d._end(rep_c, started)
    rep_d, started, _ = d._begin("d", "burst")
    d._record(_ok("gen.gguf"))  # a phase-(c) user still running during (d)
    rep_d.outcomes.append(_ok("wri.gguf"))
    d._end(rep_d, started)
    d._record(_ok("gen.gguf"))  # after the last phase closed: in no phase
    table = {p["phase"]: p for p in (r.as_dict() for r in d.phases)}
    assert (table["c"]["requests"], table["d"]["requests"]) == (3, 2)
    assert d.late == 1
    printed = [ln for ln in lines if "answered" in ln]
    assert "3/3 answered" in printed[0] and "2/2 answered" in printed[1]


def test_phase_d_reports_evicted_model_503s_and_fails_on_any_other():
    from grid_fleet import traffic
    from grid_fleet.demo import DemoFailure

    d = _demo()
    rep, _started, _ = d._begin("d", "burst")
    low503 = traffic.Outcome(model="cod.gguf", status=503, first_status=503, error="HTTP 503")
    rep.outcomes += [_ok("wri.gguf"), low503]
    d._check_d(rep)
    assert rep.as_dict()["unavailable_503"] == 1
    assert any("1 request(s) for cod.gguf got 503" in n for n in rep.notes)
    rep.outcomes.append(
        traffic.Outcome(model="gen.gguf", status=503, first_status=503, error="HTTP 503")
    )
    with pytest.raises(DemoFailure, match=r"demo phase \(d\): 1 of 2"):
        d._check_d(rep)


def test_status_shows_the_live_profiles_not_the_launch_time_ones():
    from grid_fleet import cli

    launched = {
        "model_id": "gen.gguf",
        "priority": 50,
        "memory_mb": 100,
        "min_replicas": 1,
        "max_replicas": 3,
    }
    doc = {
        "running": True,
        "url": "http://127.0.0.1:1",
        "server_pid": 1,
        "token_file": "/t",
        "hosts": [],
        "models": [launched],
        "allocator": {
            "mode": "automatic",
            "controller": {
                "hosts": [],
                "profiles": [
                    dict(launched, priority=90, max_replicas=2),
                    dict(launched, model_id="added.gguf", priority=5, min_replicas=0),
                ],
            },
        },
    }
    text = cli.render_status(doc)
    assert "profiles (live, from the allocator)" in text
    rows = {ln.split()[0]: ln.split() for ln in text.splitlines() if ".gguf" in ln}
    assert rows["gen.gguf"][1:4] == ["90", "100", "1..2"]
    assert rows["added.gguf"][1] == "5"
    del doc["allocator"]
    assert "profiles (as launched)" in cli.render_status(doc)


def test_status_renders_live_profiles_that_omit_default_fields():
    """The server omits default-valued fields (min_replicas 0, max_replicas 1, priority...)."""
    from grid_fleet import cli

    doc = {
        "running": True,
        "url": "http://127.0.0.1:1",
        "server_pid": 1,
        "token_file": "/t",
        "hosts": [],
        "models": [],
        "allocator": {
            "mode": "automatic",
            "controller": {"hosts": [], "profiles": [{"model_id": "m.gguf", "memory_mb": 100}]},
        },
    }
    text = cli.render_status(doc)
    row = next(ln.split() for ln in text.splitlines() if ln.startswith("m.gguf"))
    d = cli.PROFILE_DEFAULTS
    assert row[1:4] == [str(d["priority"]), "100", f"{d['min_replicas']}..{d['max_replicas']}"]


def test_watch_orders_outcomes_by_completion_and_admits_unobserved_states():
    obs = observe.Observer("http://x")
    obs.update(_status({"h1": []}), now=100.0)

    def act(aid, kind, done):
        return {
            "action_id": aid,
            "kind": kind,
            "host_id": "h1",
            "model_id": "a",
            "status": "succeeded",
            "reason": "missing_replica",
            "created_at": 100.5,
            "completed_at": done,
        }

    # The warm's id sorts first, but the load completed first.
    evs = obs.update(
        _status(
            {"h1": [("a", "ready")]}, [act("0-warm", "warm", 103.0), act("9-load", "load", 102.0)]
        ),
        now=104.0,
    )
    assert [(e.kind, e.detail.split()[0] if e.detail else e.after) for e in evs] == [
        ("command", "load"),
        ("command", "warm"),
        ("residency", "ready"),
    ]
    line = evs[-1].line(100.0)
    assert line.endswith("absent -> ready (via cached, warming)"), line
    assert [e.at for e in evs] == [102.0, 103.0, 104.0]
    step = obs.update(_status({"h1": [("a", "draining")]}), now=105.0)
    assert "via" not in step[0].line(100.0)
    assert observe.skipped_note("ready", "absent") == "via draining, cached"
    assert observe.skipped_note("warming", "loading") == "via ready, draining, cached, absent"
    first = observe.Observer("http://x").update(_status({"h1": [("a", "ready")]}), now=1.0)
    assert first[0].line(0.0).endswith("residency: ready (state when watching began)")


def test_the_status_settings_line_can_be_typed_back():
    """The settings line reads like the start command: pasted back beside the running fleet
    it asks for that fleet (an equal split of 5351 MB is not '5.23', which is 5355 MB), and
    with a media node it gives one value per text node, as the flag takes them."""
    from grid_fleet import cli

    doc = {"machines": 4, "capacities_mb": [5351] * 4, "port": 1, "engine_port_base": 2}
    [line] = cli._settings_line(doc)
    typed = line.split("--text-capacities-gib ")[1].split()[0]
    assert layout.text_capacities(typed, 4) == (5351,) * 4, line
    media = {**doc, "capacities_mb": [4096, 4096, 4096, 3900], "include_comfyui": True}
    [line] = cli._settings_line(media)
    assert "--text-capacities-gib 4,4,4 " in line and line.endswith("--include-comfyui"), line


def test_status_warns_while_compete_edits_are_applied(tmp_path):
    """A killed ``grid test compete`` leaves its journal: status names the edited models
    until a later run undoes them, and says nothing without a journal."""
    from grid_fleet import cli, lifecycle

    root = tmp_path / "fleet"
    saved_fleet(root)
    doc = lifecycle.status_document(root)
    assert doc["compete_edits"] == []
    assert "compete" not in cli.render_status(doc)
    # The settings line reads like the start command that made the fleet.
    assert "settings: --machines 2 --text-capacities-gib 2,2 --port 1" in cli.render_status(doc)
    edit = {"original": {}, "original_version": "v1", "written_version": "v2"}
    (root / layout.COMPETE_JOURNAL).write_text(json.dumps({"b.gguf": edit, "a.gguf": edit}))
    doc = lifecycle.status_document(root)
    assert doc["compete_edits"] == ["a.gguf", "b.gguf"]
    text = cli.render_status(doc)
    assert (
        "warning: 'grid test compete' temporary profile edits are applied to a.gguf, b.gguf" in text
    )
    (root / layout.COMPETE_JOURNAL).write_text("{not json")
    assert "unreadable journal" in lifecycle.status_document(root)["compete_edits"][0]


def test_a_new_fleet_forgets_the_compete_edits_of_the_stopped_one(tmp_path):
    """A compete run killed with an edit applied, then stop and start: the new fleet's
    profiles are fresh, so status must not warn about the old fleet's edits (and the next
    compete must not fail trying to undo them)."""
    from grid_fleet import lifecycle

    root = tmp_path / "fleet"
    saved_fleet(root)
    edit = {"original": {}, "original_version": "v1", "written_version": "v2"}
    (root / layout.COMPETE_JOURNAL).write_text(json.dumps({"slow-coder.gguf": edit}))
    layout.record_path(root).unlink()  # stopped
    lifecycle._fresh(root)  # what a new start does before it launches anything
    saved_fleet(root)  # started again
    assert lifecycle.status_document(root)["compete_edits"] == []


def test_a_start_whose_output_pipe_closes_stops_what_it_started(tmp_path, monkeypatch):
    """`grid test start | head -2`: the reader goes away right after the server is up. The
    next line fails with a broken pipe; start must still stop the server it launched (its
    clean-up cannot print either) instead of leaving a half-started fleet."""
    import os
    import signal

    from grid_fleet import lifecycle

    from grid_core.system.identity import is_gone

    home = tmp_path / "home"
    monkeypatch.setenv("GRID_HOME", str(home))
    root = home / "fleet"
    lines: list[str] = []

    def echo(line: str) -> None:
        if any(seen.startswith("  server pid ") for seen in lines):
            raise BrokenPipeError(32, "Broken pipe")
        lines.append(line)

    settings = FleetSettings(
        machines=1, port=0, engine_port_base=30000, capacities_mb=(2048,), models=()
    )
    try:
        with pytest.raises(BrokenPipeError):
            lifecycle.start(settings, echo, root)
    finally:
        started = [line for line in lines if line.startswith("  server pid ")]
        pids = [int(line.split()[2]) for line in started]
        left = [pid for pid in pids if not is_gone(pid)]
        for pid in left:  # never leave a server behind, even when the check below fails
            os.kill(pid, signal.SIGKILL)
    assert pids, lines  # the server was up when the pipe closed
    assert left == []
    assert layout.load_record(root) is None
