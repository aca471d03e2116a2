"""``grid allocator qualify llama.cpp``: the real lifecycle on this host, with evidence.

Steps: inventory (find llama-server, hash the GGUF), identity (digest matches), warm (start a
child), ownership (its identity proof holds), readiness, one real completion, activity
(authenticated /slots), drain and stop. The evidence file is written atomically, owner-only.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import tempfile
import time
from pathlib import Path

import httpx

from grid_core.api import (
    DEFAULT_ENGINE_PORT_RANGE,
    ChildRecord,
    GridError,
    LoadResult,
    LocalRuntimeHost,
    grid_home,
    write_atomic,
)
from grid_llamacpp.adapter import LlamaCppAdapter
from grid_llamacpp.artifacts import sha256_file

COMPLETION_TIMEOUT_S = 120.0
"""Seconds one qualification completion may take on a slow CPU."""


class _Steps:
    """Ordered qualification steps with their outcome."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def __call__(self, name: str, ok: bool, detail: str) -> bool:
        self.rows.append({"name": name, "ok": ok, "detail": detail, "at": time.time()})
        return ok


async def _exercise(
    adapter: LlamaCppAdapter, host: LocalRuntimeHost, child: ChildRecord, step: _Steps
) -> None:
    """Ownership, readiness, one completion, activity, drain and stop of a warm child."""
    proof = adapter.proof(child)
    step("ownership", proof.status == "proven", proof.reason or "identity proven")
    probe = await adapter.probe(host, child)
    step("readiness", probe.ready, probe.detail or "/health 200 and alias listed")
    async with httpx.AsyncClient(timeout=COMPLETION_TIMEOUT_S) as client:
        r = await client.post(
            f"{child.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {host.api_key}"},
            json={
                "model": child.alias,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        unauth = await client.get(f"{child.url}/slots")
    usage = r.json().get("usage", {}) if r.status_code == 200 else {}
    step(
        "completion",
        r.status_code == 200 and usage.get("completion_tokens", 0) > 0,
        f"HTTP {r.status_code}, {usage.get('completion_tokens', 0)} tokens",
    )
    active = await adapter.activity(host, child)
    step(
        "activity",
        active is not None and unauth.status_code == 401,
        f"{active} busy slot(s); unauthenticated /slots -> {unauth.status_code}",
    )
    left = await adapter.drain(host, child, 30.0)
    step("drain", left == 0, f"{left} request(s) left")
    await adapter.unload(host, child, idle_wait_s=30.0)
    step("stop", True, f"pid {child.pid} stopped")


def _scratch_host(tmpdir: Path, model: Path) -> LocalRuntimeHost:
    """A throw-away runtime host with its own owner-only engine key."""
    key = secrets.token_urlsafe(32)
    key_file = tmpdir / "engine-api-key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, (key + "\n").encode())
    os.close(fd)
    return LocalRuntimeHost(
        bind_host="127.0.0.1",
        state_dir=tmpdir,
        artifact_dir=tmpdir / "artifacts",
        model_dirs=(model.resolve().parent,),
        api_key=key,
        api_key_file=key_file,
        port_range=DEFAULT_ENGINE_PORT_RANGE,
        publish_fn=lambda _c: None,
        used_ports=set,
    )


def _write_evidence(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, json.dumps(doc, indent=2))


async def run_qualification(model: Path, sha256: str | None, evidence: Path | None) -> dict:
    """Run the lifecycle and return the evidence document (also written to disk).

    Args:
        model: the GGUF to run.
        sha256: expected digest, if declared.
        evidence: where to write the evidence (default ``$GRID_HOME/qualification/``).

    Returns:
        The evidence: steps with outcome and detail, ``passed`` and ``evidence_path``.
    """
    step = _Steps()
    adapter = LlamaCppAdapter()
    child: ChildRecord | None = None
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="grid-qualify-") as tmp:
        host = _scratch_host(Path(tmp), model)
        try:
            exe = adapter.executable()
            digest = sha256_file(model)
            step("inventory", True, f"{exe}; {model} {model.stat().st_size} bytes")
            if step(
                "identity",
                sha256 is None or sha256 == digest,
                f"sha256 {digest}" + ("" if sha256 in (None, digest) else f" != {sha256}"),
            ):
                loaded = LoadResult(
                    model_id=model.name,
                    path=str(model.resolve()),
                    sha256=sha256,
                    size_bytes=model.stat().st_size,
                )
                t0 = time.monotonic()
                child = await adapter.warm(host, loaded, 0)
                step(
                    "warm",
                    True,
                    f"pid {child.pid} port {child.port} ready in {time.monotonic() - t0:.2f} s",
                )
                await _exercise(adapter, host, child, step)
                child = None
        except GridError as exc:
            step("error", False, str(exc))
        finally:
            if child is not None:
                try:
                    await adapter.unload(host, child, idle_wait_s=0.0, force=True)
                except GridError as exc:
                    step("cleanup", False, str(exc))
    rows = step.rows
    passed = all(s["ok"] for s in rows) and any(s["name"] == "stop" for s in rows)
    doc = {
        "runtime": "llama.cpp",
        "model": str(model),
        "artifact_sha256": sha256,
        "host": platform.node(),
        "started_at": started,
        "finished_at": time.time(),
        "passed": passed,
        "steps": rows,
    }
    path = evidence or (grid_home() / "qualification" / f"llama.cpp-{int(started)}.json")
    _write_evidence(path, doc)
    doc["evidence_path"] = str(path)
    return doc
