"""Real llama-server children driven by the node actuator through controller commands."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import msgspec
import psutil
import pytest
from engine_pace import drain_while_busy

from grid_core.protection import ProtectionDecision
from grid_core.system import is_gone, prove, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
WAIT_S = 60.0
"""Upper bound for an engine to reach a state on a busy 2-core machine (never asserted)."""

ACCEPTING = ProtectionDecision(
    state="accepting", reason="", sensor_state="accepting", sensor_reason="", raw_state="accepting"
)
REQUEST_TIMEOUT_S = 600.0
"""Generous: the machine is shared and may be compiling on both cores."""


async def run(node, kind, model_id="tiny.gguf", **kw):
    cmd = node.command(kind, model_id, **kw)
    return await node.act.execute(cmd, deadline_mono=time.monotonic() + 60, decision=ACCEPTING)


def key(node) -> dict[str, str]:
    return {"Authorization": f"Bearer {node.act.state.engine_api_key}"}


async def wait_busy(node, child) -> None:
    adapter = node.act.adapter_for("llama.cpp")

    async def busy() -> bool:
        return (await adapter.activity(node.act.host, child) or 0) > 0

    if not await wait_until(busy, timeout_s=WAIT_S, interval_s=0.05):
        raise AssertionError("request never became active")


async def test_load_warm_complete_drain_in_flight_unload(node):
    load = await run(node, "load", "mid.gguf")
    assert load.status == "succeeded" and load.artifact_fetched is False
    warm = await run(node, "warm", "mid.gguf", dependencies=[load.action_id])
    assert warm.status == "succeeded", warm.message
    child = node.act.state.children["mid.gguf"]
    assert child.state == "ready"
    [row] = [r for r in node.act.residencies() if r.model_id == "mid.gguf"]
    assert row.state == "ready" and row.route_url == child.url

    # Key never in argv or env; the key file is owner-only.
    proc = psutil.Process(child.pid)
    secret = node.act.state.engine_api_key
    assert all(secret not in a for a in proc.cmdline())
    assert all(secret not in v for v in proc.environ().values())
    assert oct(os.stat(node.store.key_path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(node.store.path).st_mode & 0o777) == "0o600"

    async with httpx.AsyncClient(base_url=child.url, timeout=REQUEST_TIMEOUT_S) as client:
        unauth = await client.post("/v1/chat/completions", json={"messages": []})
        assert unauth.status_code == 401  # LAN clients cannot bypass the route fence
        r = await client.post(
            "/v1/chat/completions",
            headers=key(node),
            json={
                "model": "mid.gguf",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "Reply with OK"}],
            },
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0

        finished: dict[str, float] = {}

        async def long_request(tokens: int) -> httpx.Response:
            # The engine's URL as it is now: a retry restarts the engine on a new port.
            url = node.act.state.children["mid.gguf"].url
            resp = await client.post(
                f"{url}/v1/completions",
                headers=key(node),
                json={
                    "model": "mid.gguf",
                    "prompt": "hello",
                    "max_tokens": tokens,
                    "ignore_eos": True,
                },
            )
            finished["request"] = time.monotonic()
            return resp

        async def running() -> int | None:
            now = node.act.state.children["mid.gguf"]
            return await node.act.adapter_for("llama.cpp").activity(node.act.host, now)

        async def restart() -> None:
            assert (await run(node, "unload", "mid.gguf")).status == "succeeded"
            assert (await run(node, "warm", "mid.gguf")).status == "succeeded"

        busy = await drain_while_busy(
            long_request,
            running,
            lambda: node.act.drain("mid.gguf", wait_s=0.0),  # fence only; still busy
            restart,
        )
        assert "still running" in busy.drained
        child = node.act.state.children["mid.gguf"]
        assert child.state == "draining"
        print(f"drain saw the request running on attempt {busy.attempts} ({busy.tokens} tokens)")

        async def unload() -> object:
            ack = await run(node, "unload", "mid.gguf")
            finished["unload"] = time.monotonic()
            return ack

        unload_task = asyncio.create_task(unload())
        resp = await busy.request
        ack = await unload_task
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] == busy.tokens  # not cut short
    assert ack.status == "succeeded", ack.message
    assert finished["request"] <= finished["unload"]  # the unload waited for the request
    assert "mid.gguf" not in node.act.state.children
    assert is_gone(child.pid)
    [row] = [r for r in node.act.residencies() if r.model_id == "mid.gguf"]
    assert row.state == "cached"


async def test_kill_9_is_detected_and_reported(node):
    assert (await run(node, "warm")).status == "succeeded"
    child = node.act.state.children["tiny.gguf"]
    os.kill(child.pid, signal.SIGKILL)
    await wait_until(node.act.refresh, timeout_s=WAIT_S, interval_s=0.05)
    [row] = [r for r in node.act.residencies() if r.model_id == "tiny.gguf"]
    assert row.state == "failed"
    assert "process lost" in node.act.state.children["tiny.gguf"].failure
    assert any("exited unexpectedly" in e for e in node.act.events)
    # The controller's cleanup releases the dead handle; a fresh warm then works.
    assert (await run(node, "unload")).status == "succeeded"
    assert (await run(node, "warm")).status == "succeeded"


async def test_restart_adopts_the_exact_live_child_and_can_drain_and_unload_it(node):
    assert (await run(node, "warm")).status == "succeeded"
    before = node.act.state.children["tiny.gguf"]
    act = node.restart()
    await act.recover()
    adopted = act.state.children["tiny.gguf"]
    assert adopted.state == "ready" and adopted.pid == before.pid
    assert any("adopted tiny.gguf" in e for e in act.events)
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(
            f"{adopted.url}/v1/completions",
            headers=key(node),
            json={"prompt": "hi", "max_tokens": 4},
        )
    assert r.status_code == 200
    assert (await run(node, "drain")).status == "succeeded"
    ack = await run(node, "unload")
    assert ack.status == "succeeded", ack.message
    assert is_gone(before.pid)


async def test_restart_marks_interrupted_action_failed(node):
    node.act.state.running_action = "warm-x-1"
    node.act.state.running_kind = "warm"
    node.act.save()
    act = node.restart()
    await act.recover()
    receipt = act.state.receipt("warm-x-1")
    assert receipt is not None and receipt.ack.status == "failed"
    assert "interrupted" in receipt.ack.message and act.state.running_action is None


async def test_unprovable_child_is_never_signalled(node, sleeper):
    assert (await run(node, "warm")).status == "succeeded"
    real = node.act.state.children["tiny.gguf"]
    # The durable record now points at an unrelated process (as after PID reuse).
    forged = msgspec.structs.replace(
        real, pid=sleeper.pid, birth=psutil.Process(sleeper.pid).create_time()
    )
    node.act.state.children["tiny.gguf"] = forged
    node.act.save()
    act = node.restart()
    await act.recover()
    fenced = act.state.children["tiny.gguf"]
    assert fenced.state == "failed" and fenced.failure.startswith("fenced")
    ack = await run(node, "unload")
    assert ack.status == "failed" and "refusing" in ack.message
    stop = await act.stop_all(idle_wait_s=1.0)
    assert "left alone" in stop[0]
    assert sleeper.is_running() and sleeper.status() != "zombie"
    assert (
        prove(sleeper.pid, birth=forged.birth, args=(("--port", str(real.port)),)).status
        == "unproven"
    )
    # A warm cannot start a duplicate while the fenced record blocks the model.
    assert (await run(node, "warm")).status == "failed"
    # Restore the real record so the fixture can clean the real child up.
    act.state.children["tiny.gguf"] = real
    act.save()


async def test_wrong_birth_marker_is_fenced(node):
    assert (await run(node, "warm")).status == "succeeded"
    child = node.act.state.children["tiny.gguf"]
    true_birth = child.birth
    child.birth = (child.birth or 0) - 1000.0
    node.act.save()
    act = node.restart()
    await act.recover()
    assert act.state.children["tiny.gguf"].state == "failed"
    ack = await run(node, "unload")
    assert ack.status == "failed"
    assert psutil.Process(child.pid).is_running()
    act.state.children["tiny.gguf"].birth = true_birth
    act.save()


async def test_local_protection_cancels_a_warm(node):
    paused = ProtectionDecision(
        state="paused",
        reason="battery",
        sensor_state="paused",
        sensor_reason="battery",
        raw_state="paused",
    )
    ack = await node.act.execute(
        node.command("warm", "tiny.gguf"), deadline_mono=time.monotonic() + 60, decision=paused
    )
    assert ack.status == "rejected" and "local protection" in ack.message
    assert "tiny.gguf" not in node.act.state.children


def test_qualify_runs_the_real_lifecycle_and_writes_evidence(models_dir, tmp_path):
    import json
    import subprocess
    import sys

    from grid_llamacpp.artifacts import sha256_file

    model = models_dir / "tiny.gguf"
    evidence = tmp_path / "evidence.json"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from grid_core.cli import main; main()",
            "allocator",
            "qualify",
            "llama.cpp",
            str(model),
            "--artifact-sha256",
            sha256_file(model),
            "--evidence",
            str(evidence),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(evidence.read_text())
    assert doc["passed"] is True
    assert [s["name"] for s in doc["steps"]] == [
        "inventory",
        "identity",
        "warm",
        "ownership",
        "readiness",
        "inference",
        "activity",
        "drain",
        "stop",
    ]
    assert oct(os.stat(evidence).st_mode & 0o777) == "0o600"
    bad = subprocess.run(
        [
            sys.executable,
            "-c",
            "from grid_core.cli import main; main()",
            "allocator",
            "qualify",
            "llama.cpp",
            str(model),
            "--artifact-sha256",
            "0" * 64,
            "--evidence",
            str(tmp_path / "bad.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert bad.returncode == 1
    assert json.loads((tmp_path / "bad.json").read_text())["passed"] is False


async def test_a_model_that_cannot_start_fails_cleanly_and_can_be_retried(node, models_dir):
    broken = models_dir.parent / "broken-models"
    broken.mkdir(exist_ok=True)
    (broken / "broken.gguf").write_bytes(b"GGUF but not really a model")
    node.act.config.model_dirs = (*node.act.config.model_dirs, broken)
    node.act.host.model_dirs = node.act.config.model_dirs
    ack = await run(node, "warm", "broken.gguf")
    assert ack.status == "failed" and "exited before ready" in ack.message
    record = node.act.state.children["broken.gguf"]
    assert record.state == "failed" and is_gone(record.pid)
    # Nothing is left behind, and the next warm is not blocked by the failed record.
    (broken / "broken.gguf").write_bytes((models_dir / "tiny.gguf").read_bytes())
    again = await run(node, "warm", "broken.gguf")
    assert again.status == "succeeded", again.message


async def test_a_failed_durable_publication_stops_the_child(node):
    from grid_core.errors import StateError

    seen: list[int] = []
    original = node.act.host.publish_fn

    def failing(child):
        seen.append(child.pid)
        if len(seen) == 2:  # the enrichment write (executable + birth marker) fails
            raise StateError("disk full")
        original(child)

    node.act.host.publish_fn = failing
    ack = await run(node, "warm")
    assert ack.status == "failed" and "disk full" in ack.message
    assert seen and is_gone(seen[0])  # no orphan engine keeps running


async def test_warm_rehashes_a_declared_digest_before_launch(node, models_dir, tmp_path):
    from grid_llamacpp.artifacts import sha256_file

    private = tmp_path / "own-models"
    private.mkdir()
    (private / "own.gguf").write_bytes((models_dir / "tiny.gguf").read_bytes())
    node.act.config.model_dirs = (private,)
    node.act.host.model_dirs = (private,)
    digest = sha256_file(private / "own.gguf")
    load = await run(node, "load", "own.gguf", artifact_sha256=digest)
    assert load.status == "succeeded"
    with open(private / "own.gguf", "ab") as f:
        f.write(b"tampered after the load")
    warm = await run(node, "warm", "own.gguf", artifact_sha256=digest)
    assert warm.status == "failed" and "SHA-256" in warm.message
    assert "own.gguf" not in node.act.state.children  # nothing was launched
