"""The ``echo`` runtime adapter: one echo-engine child process per model on a node.

Built only on Grid's public plugin API (:mod:`grid_core.api`): the adapter starts its engine
with ``spawn_detached``, records the child's identity (PID, creation time, executable and the
``--alias``/``--port`` pair of its command line), publishes the record durably before waiting
for readiness, and never signals a process whose identity it cannot prove.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import httpx

from grid_core.api import (
    AdoptOutcome,
    ArtifactSpec,
    ChildRecord,
    ForbiddenError,
    GridError,
    LoadResult,
    NotFoundError,
    Probe,
    ProcessIdentity,
    RuntimeHost,
    SpawnedChild,
    UnavailableError,
    ValidationError,
    birth_of,
    reap,
    scrubbed_env,
    spawn_detached,
    stop_process,
    wait_until,
)

RUNTIME_NAME = "echo"
READY_TIMEOUT_S = 30.0
"""Seconds the engine may take to answer /health: a Python start-up takes well under one."""
HTTP_TIMEOUT_S = 5.0
"""Seconds for one request to a local child; loopback answers in milliseconds."""
TERM_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL for a proven child; the engine exits at once."""
PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])
"""Directory holding ``grid_echo``: put on the child's PYTHONPATH so it imports the engine."""


def identity(child: ChildRecord) -> ProcessIdentity:
    """What proves ``child`` is still the engine this adapter started."""
    return ProcessIdentity(
        pid=child.pid,
        birth=child.birth,
        executable=child.executable or None,
        args=(("--alias", child.alias), ("--port", str(child.port))),
    )


class EchoAdapter:
    """Lifecycle of echo-engine children (see :class:`grid_core.api.RuntimeAdapter`)."""

    name = RUNTIME_NAME

    async def load(self, host: RuntimeHost, artifact: ArtifactSpec) -> LoadResult:
        """Find ``artifact.model_id`` in the host's model directories and verify its digest.

        Raises:
            ValidationError: a fetch source was declared (this runtime fetches nothing).
            NotFoundError: no model directory holds the file.
            GridError: the file's SHA-256 differs from the declared one.
        """
        if artifact.source is not None:
            msg = f"{artifact.model_id}: the echo runtime does not fetch; copy the file instead"
            raise ValidationError(msg)
        for directory in host.model_dirs:
            path = directory / artifact.model_id
            if path.is_file():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                if artifact.sha256 is not None and digest != artifact.sha256:
                    msg = f"{path}: SHA-256 {digest} differs from the declared {artifact.sha256}"
                    raise GridError(msg)
                return LoadResult(
                    model_id=artifact.model_id,
                    path=str(path),
                    sha256=digest if artifact.sha256 else None,
                    size_bytes=path.stat().st_size,
                )
        dirs = ", ".join(str(d) for d in host.model_dirs) or "none configured"
        msg = f"{artifact.model_id} is in no model directory ({dirs}); copy it there"
        raise NotFoundError(msg)

    async def warm(
        self,
        host: RuntimeHost,
        loaded: LoadResult,
        memory_mb: int,
        *,
        embeddings: bool = False,
        ready_timeout_s: float | None = None,
    ) -> ChildRecord:
        """Start an engine for ``loaded``, publish its record, and wait until it is ready.

        Raises:
            ValidationError: ``embeddings`` was asked for (the echo engine serves none).
            StateError: the record could not be published (the child is stopped first).
            UnavailableError: the engine exited or did not become ready in time (stopped).
        """
        if embeddings:
            msg = f"{loaded.model_id}: the echo runtime serves no embeddings; use llama.cpp"
            raise ValidationError(msg)
        port = host.allocate_port()
        alias = loaded.model_id
        executable = os.path.realpath(sys.executable)
        argv = [
            executable,
            "-m",
            "grid_echo.engine",
            "--alias",
            alias,
            "--host",
            host.bind_host,
            "--port",
            str(port),
            "--api-key-file",
            str(host.api_key_file),
            "--model",
            loaded.path,
        ]
        log_path = host.state_dir / f"echo-{port}.log"
        env = scrubbed_env(PYTHONPATH=os.pathsep.join([PACKAGE_ROOT, *sys.path[1:]]))
        pid = spawn_detached(argv, log_path=log_path, env=env, truncate_log=True)
        child = ChildRecord(
            runtime=RUNTIME_NAME,
            model_id=loaded.model_id,
            alias=alias,
            pid=pid,
            port=port,
            host=host.bind_host,
            executable=executable,
            model_path=loaded.path,
            birth=birth_of(pid),
            artifact_sha256=loaded.sha256,
            memory_mb=memory_mb,
            started_at=time.time(),
        )
        try:
            host.publish(child)  # durable before we wait: a node crash now can still adopt it
        except GridError:
            await stop_process(SpawnedChild(pid), grace_s=TERM_GRACE_S)
            raise

        async def ready() -> bool:
            if SpawnedChild(pid).prove().status == "dead":
                msg = f"echo engine for {alias} exited during start-up; see {log_path}"
                raise UnavailableError(msg)
            return (await self.probe(host, child)).ready

        try:
            timeout_s = ready_timeout_s or READY_TIMEOUT_S
            if not await wait_until(ready, timeout_s=timeout_s):
                msg = f"echo engine for {alias} not ready after {timeout_s:.0f} s"
                raise UnavailableError(msg)
        except GridError:
            await stop_process(SpawnedChild(pid), grace_s=TERM_GRACE_S)
            reap(pid)
            raise
        child.state = "ready"
        host.publish(child)
        return child

    async def _get(self, host: RuntimeHost, child: ChildRecord, path: str) -> httpx.Response:
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as client:
            return await client.get(
                f"{child.url}{path}", headers={"Authorization": f"Bearer {host.api_key}"}
            )

    async def _active(self, host: RuntimeHost, child: ChildRecord) -> int | None:
        try:
            r = await self._get(host, child, "/activity")
        except httpx.HTTPError:
            return None
        return int(r.json()["active"]) if r.status_code == 200 else None

    async def probe(self, host: RuntimeHost, child: ChildRecord) -> Probe:
        """Identity, readiness (``/health`` and the alias listed) and requests in flight."""
        proof = identity(child).prove()
        if proof.status != "proven":
            return Probe(alive=False, ready=False, detail=proof.reason)
        try:
            health = await self._get(host, child, "/health")
            models = await self._get(host, child, "/v1/models")
        except httpx.HTTPError as exc:
            return Probe(alive=True, ready=False, detail=f"not answering: {type(exc).__name__}")
        listed = models.status_code == 200 and any(
            m.get("id") == child.alias for m in models.json().get("data", [])
        )
        ready = health.status_code == 200 and listed
        return Probe(
            alive=True,
            ready=ready,
            active_requests=await self._active(host, child),
            max_concurrency=None,
            detail="" if ready else f"/health {health.status_code}, alias listed: {listed}",
        )

    async def drain(self, host: RuntimeHost, child: ChildRecord, deadline_s: float) -> int | None:
        """Wait up to ``deadline_s`` seconds for no request in flight; returns requests left."""

        async def idle() -> bool:
            return await self._active(host, child) == 0

        await wait_until(idle, timeout_s=deadline_s)
        return await self._active(host, child)

    async def unload(
        self, host: RuntimeHost, child: ChildRecord, *, idle_wait_s: float, force: bool = False
    ) -> None:
        """Stop a proven, idle child.

        Raises:
            ForbiddenError: the process is alive but not provably ours (never signalled).
            UnavailableError: requests are still in flight after ``idle_wait_s`` (left
                running) unless ``force``.
        """
        who = identity(child)
        proof = who.prove()
        if proof.status == "dead":
            reap(child.pid)
            return
        if proof.status != "proven":
            msg = f"refusing to stop pid {child.pid}: {proof.reason}"
            raise ForbiddenError(msg)
        if not force:
            left = await self.drain(host, child, idle_wait_s)
            if left:
                msg = f"{child.alias}: {left} request(s) still in flight; left running"
                raise UnavailableError(msg)
        await stop_process(who, grace_s=TERM_GRACE_S)
        reap(child.pid)

    async def adopt(self, host: RuntimeHost, child: ChildRecord) -> tuple[AdoptOutcome, str]:
        """After a node restart: adopt a proven, ready child; fence anything unprovable."""
        proof = identity(child).prove()
        if proof.status == "dead":
            return "dead", proof.reason
        if proof.status != "proven":
            return "fenced", proof.reason
        probe = await self.probe(host, child)
        if not probe.ready:
            return "fenced", probe.detail or "not ready"
        return "adopted", ""
