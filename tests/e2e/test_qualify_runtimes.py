"""``grid allocator qualify vllm|ollama|comfyui`` end to end against the FAKE engines.

The command runs each runtime's real adapter through the whole lifecycle and writes owner-only
evidence; with the engine missing it fails with one line saying what is missing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fake_engines import (
    comfyui_service,
    make_vllm_snapshot,
    ollama_service,
    vllm_launcher,
    write_workflow_manifest,
)
from grid_vllm.snapshots import snapshot_digest

from grid_node.qualify import STEP_NAMES

pytestmark = pytest.mark.e2e


def grid(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    clean["GRID_HOME"] = str(tmp_path / "home")
    clean["PATH"] = "/usr/bin:/bin"  # no real vllm can be found by accident
    return clean


def assert_passed(out: subprocess.CompletedProcess[str], evidence: Path, runtime: str) -> None:
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(evidence.read_text())
    assert doc["passed"] is True and doc["runtime"] == runtime
    assert [s["name"] for s in doc["steps"]] == list(STEP_NAMES)
    assert all(s["ok"] for s in doc["steps"])
    assert oct(evidence.stat().st_mode & 0o777) == "0o600"


def test_qualify_vllm(tmp_path: Path, env: dict[str, str]) -> None:
    snap = make_vllm_snapshot(tmp_path / "models" / "fake-qwen", {"start_delay_s": 0.3})
    digest, _ = snapshot_digest(snap)
    env["GRID_VLLM"] = str(vllm_launcher(tmp_path / "bin"))
    evidence = tmp_path / "vllm.json"
    out = grid(
        env, "allocator", "qualify", "vllm", str(snap),
        "--artifact-sha256", digest, "--evidence", str(evidence),
    )  # fmt: skip
    assert_passed(out, evidence, "vllm")
    assert "ok   inference  HTTP 200" in out.stdout
    wrong = grid(
        env, "allocator", "qualify", "vllm", str(snap),
        "--artifact-sha256", "0" * 64, "--evidence", str(tmp_path / "wrong.json"),
    )  # fmt: skip
    assert wrong.returncode == 1
    doc = json.loads((tmp_path / "wrong.json").read_text())
    assert doc["passed"] is False and doc["steps"][-1]["name"] == "identity"


def test_qualify_ollama(tmp_path: Path, env: dict[str, str]) -> None:
    digest = "c" * 64
    with ollama_service(tmp_path, {"fake-llama:1b": {"digest": digest, "size": 10}}) as svc:
        env["GRID_OLLAMA_URL"] = svc.url
        evidence = tmp_path / "ollama.json"
        out = grid(
            env, "allocator", "qualify", "ollama", "fake-llama:1b",
            "--artifact-sha256", digest, "--evidence", str(evidence),
        )  # fmt: skip
        assert_passed(out, evidence, "ollama")
        events = [e["event"] for e in svc.events() if e["event"] in ("load", "unload")]
    assert events == ["load", "unload"]  # warmed, then released from memory on stop


def test_qualify_comfyui(tmp_path: Path, env: dict[str, str]) -> None:
    models = tmp_path / "workflows"
    write_workflow_manifest(models / "image-sdxl.workflow.json", "image-sdxl")
    with comfyui_service(tmp_path) as svc:
        env["GRID_COMFYUI_URL"] = svc.url
        evidence = tmp_path / "comfyui.json"
        out = grid(
            env, "allocator", "qualify", "comfyui", "image-sdxl",
            "--models-dir", str(models), "--evidence", str(evidence),
        )  # fmt: skip
        assert_passed(out, evidence, "comfyui")
        assert "PNG of" in out.stdout
        assert svc.events("unload")  # /free released the checkpoint


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("runtime", "model", "setting", "missing"),
    [
        ("vllm", "some-model", {}, "vLLM is not installed on this host"),
        ("ollama", "llama3:8b", {"GRID_OLLAMA_URL": "http://127.0.0.1:{port}"}, "Ollama is not"),
        ("comfyui", "image-sdxl", {"GRID_COMFYUI_URL": "http://127.0.0.1:{port}"}, "ComfyUI is "),
    ],
)
def test_a_missing_engine_is_one_line(
    tmp_path: Path, env: dict[str, str], runtime: str, model: str, setting: dict, missing: str
) -> None:
    port = closed_port()
    env.update({k: v.format(port=port) for k, v in setting.items()})
    evidence = tmp_path / "missing.json"
    out = grid(env, "allocator", "qualify", runtime, model, "--evidence", str(evidence))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and missing in lines[0], out.stderr
    assert out.stdout == ""
    doc = json.loads(evidence.read_text())
    assert doc["passed"] is False and missing in doc["missing"]
