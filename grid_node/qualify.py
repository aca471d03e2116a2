"""``grid allocator qualify RUNTIME MODEL``: the real lifecycle of one runtime on this host.

Before a newly installed engine adapter is enabled on a physical provider, the operator runs
its whole lifecycle once, locally, through the same adapter the node would use: inventory
(the engine is installed/reachable), identity (the artifact's immutable digest), warm,
ownership (the child's identity proof), native readiness, one real inference, activity
accounting (and that the engine's routes refuse a caller without the key), drain and stop.
Every step's outcome is written as durable, owner-only evidence (specification,
"Operations": physical runtime qualification).

An adapter provides the optional parts through two methods: ``inventory() -> str`` (plain
or async; raises ``NotFoundError`` naming what is missing) and ``async infer(host, child) ->
str`` (one real request; raises on a wrong answer).
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from grid_core.errors import GridError, NotFoundError, ValidationError
from grid_core.runtime import ArtifactSpec, ChildRecord, RuntimeAdapter
from grid_core.system import grid_home, is_gone, write_atomic
from grid_core.system.runtime_host import DEFAULT_ENGINE_PORT_RANGE, LocalRuntimeHost

DRAIN_WAIT_S = 30.0
"""Seconds the drain step waits for the engine to report idle after the inference."""
STOP_WAIT_S = 30.0
"""Seconds the stop step waits for idleness before stopping the child."""
STEP_NAMES = (
    "inventory",
    "identity",
    "warm",
    "ownership",
    "readiness",
    "inference",
    "activity",
    "drain",
    "stop",
)
"""Every step a passing qualification records, in order."""


class Steps:
    """Ordered qualification steps with their outcome."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def __call__(self, name: str, ok: bool, detail: str) -> bool:
        self.rows.append({"name": name, "ok": ok, "detail": detail, "at": time.time()})
        return ok


def scratch_host(tmpdir: Path, model_dirs: tuple[Path, ...]) -> LocalRuntimeHost:
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
        model_dirs=model_dirs,
        api_key=key,
        api_key_file=key_file,
        port_range=DEFAULT_ENGINE_PORT_RANGE,
        publish_fn=lambda _c: None,
        used_ports=set,
    )


def locate(model: str, models_dir: Path | None) -> tuple[str, tuple[Path, ...]]:
    """The model id and the directories to find it in.

    A path to an existing file or directory (a GGUF, a vLLM snapshot) is found in its parent
    under its own name; anything else is an id looked up in ``models_dir`` (default
    ``$GRID_HOME/models``).
    """
    path = Path(model).expanduser()
    if path.exists() and ("/" in model or path.is_absolute() or path.suffix):
        resolved = path.resolve()
        return resolved.name, (resolved.parent,)
    return model, ((models_dir or grid_home() / "models").expanduser().resolve(),)


async def _exercise(
    adapter: RuntimeAdapter, host: LocalRuntimeHost, child: ChildRecord, step: Steps
) -> None:
    probe = await adapter.probe(host, child)
    step("ownership", probe.alive, probe.detail or f"pid {child.pid} identity proven")
    step("readiness", probe.ready, probe.detail or "health and model routes answer")
    infer = getattr(adapter, "infer", None)
    if infer is None:
        step("inference", False, f"the {adapter.name} adapter offers no inference check")
    else:
        try:
            step("inference", True, await infer(host, child))
        except (GridError, httpx.HTTPError, ValueError) as exc:
            step("inference", False, str(exc))
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
        try:
            unauth = (await client.get(f"{child.url}/v1/models")).status_code
        except httpx.HTTPError as exc:
            unauth = 0
            step("activity", False, f"engine did not answer: {exc}")
    after = await adapter.probe(host, child)
    if unauth:
        step(
            "activity",
            after.active_requests is not None and unauth == 401,
            f"{after.active_requests} request(s) active; unauthenticated /v1/models -> {unauth}",
        )
    left = await adapter.drain(host, child, DRAIN_WAIT_S)
    step("drain", left == 0, f"{left} request(s) left")
    await adapter.unload(host, child, idle_wait_s=STOP_WAIT_S)
    step("stop", is_gone(child.pid), f"pid {child.pid} stopped")


async def run_qualification(
    adapter: RuntimeAdapter,
    model: str,
    artifact: ArtifactSpec,
    model_dirs: tuple[Path, ...],
    evidence: Path | None,
) -> dict[str, Any]:
    """Run the lifecycle and return the evidence document (also written to disk, 0600).

    Args:
        adapter: the runtime adapter to qualify.
        model: what the operator named (kept in the evidence).
        artifact: the model id and its declared digest/source/size ceiling.
        model_dirs: where the adapter looks for local artifacts.
        evidence: evidence path (default ``$GRID_HOME/qualification/<runtime>-<time>.json``).

    Returns:
        ``runtime``, ``model``, ``passed``, ``steps`` (name, ok, detail, at), ``missing``
        (the one line naming what is missing when the engine is absent, else ``None``) and
        ``evidence_path``.
    """
    step = Steps()
    child: ChildRecord | None = None
    missing: str | None = None
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="grid-qualify-") as tmp:
        host = scratch_host(Path(tmp), model_dirs)
        try:
            inventory = getattr(adapter, "inventory", None)
            try:
                found = inventory() if inventory else f"{adapter.name} adapter"
                if inspect.isawaitable(found):
                    found = await found
                step("inventory", True, str(found))
            except NotFoundError as exc:
                missing = str(exc)
                raise
            loaded = await adapter.load(host, artifact)
            step("identity", True, f"{loaded.path} sha256 {loaded.sha256 or '(none declared)'}")
            t0 = time.monotonic()
            child = await adapter.warm(host, loaded, 0)
            step(
                "warm", True, f"pid {child.pid} port {child.port} in {time.monotonic() - t0:.2f} s"
            )
            await _exercise(adapter, host, child, step)
            child = None
        except GridError as exc:
            done = {r["name"] for r in step.rows}
            name = next(n for n in STEP_NAMES if n not in done)
            step(name, False, str(exc))
        finally:
            if child is not None:
                try:
                    await adapter.unload(host, child, idle_wait_s=0.0, force=True)
                except GridError as exc:
                    step("cleanup", False, str(exc))
    rows = step.rows
    passed = [r["name"] for r in rows] == list(STEP_NAMES) and all(r["ok"] for r in rows)
    doc: dict[str, Any] = {
        "runtime": adapter.name,
        "model": model,
        "artifact_sha256": artifact.sha256,
        "artifact_source": artifact.source,
        "host": platform.node(),
        "started_at": started,
        "finished_at": time.time(),
        "passed": passed,
        "missing": missing,
        "steps": rows,
    }
    path = evidence or (grid_home() / "qualification" / f"{adapter.name}-{int(started)}.json")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, json.dumps(doc, indent=2))
    doc["evidence_path"] = str(path)
    return doc


def check_artifact(artifact_sha256: str | None, size_mb: int | None) -> None:
    """Refuse malformed artifact options before anything runs.

    Raises:
        ValidationError: a digest that is not 64 lowercase hex, or a non-positive size.
    """
    if artifact_sha256 is not None and (
        len(artifact_sha256) != 64 or any(c not in "0123456789abcdef" for c in artifact_sha256)
    ):
        msg = f"--artifact-sha256 {artifact_sha256!r}: use 64 lowercase hex digits"
        raise ValidationError(msg)
    if size_mb is not None and size_mb <= 0:
        msg = f"--artifact-size-mb {size_mb}: use a positive size in MB"
        raise ValidationError(msg)
