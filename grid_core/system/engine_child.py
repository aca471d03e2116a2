"""The lifecycle of one Grid-owned HTTP engine child, shared by runtime adapters.

Every managed runtime ends in the same shape: Grid spawns one process per resident model
(an engine such as ``vllm serve``, or a small Grid gateway in front of a loopback service such
as Ollama or ComfyUI), records it durably before waiting on it, proves its identity before it
ever signals it, and treats "ready" as the engine's own health and model routes answering.
:class:`EngineChildAdapter` implements that contract once — warm, probe, drain, unload and
adopt — and a runtime plugin supplies only what differs: the command line, the identity
flags, the readiness and activity checks (specification, "Managed host actuator").

The engine key never travels in argv or the child's environment: subclasses pass the
0600 key file (or a 0600 configuration file holding it) and probes authenticate with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from pathlib import Path

import httpx

from grid_core.errors import (
    ForbiddenError,
    GridError,
    StateError,
    UnavailableError,
    ValidationError,
)
from grid_core.runtime import AdoptOutcome, ChildRecord, LoadResult, Probe, RuntimeHost
from grid_core.system.identity import (
    ProcessIdentity,
    Proof,
    SpawnedChild,
    birth_of,
    exe_of,
    is_gone,
    reap,
)
from grid_core.system.poll import wait_until
from grid_core.system.spawn import spawn_detached
from grid_core.system.stop import stop_process

PROBE_TIMEOUT_S = 5.0
"""Seconds for one HTTP probe of a local child; loopback answers in milliseconds."""
POLL_INTERVAL_S = 0.1
"""Readiness/idle polling period."""
TERM_GRACE_S = 15.0
"""Seconds after SIGTERM before a still-proven child is killed."""
LOG_TAIL_CHARS = 500
"""Characters of a failed child's log quoted in the error message."""


def log_tail(path: Path) -> str:
    """The last lines of a child's log on one line (for an error message)."""
    try:
        data = path.read_bytes()[-4 * LOG_TAIL_CHARS :]
    except OSError:
        return ""
    return data.decode(errors="replace").strip().replace("\n", " | ")[-LOG_TAIL_CHARS:]


class EngineChildAdapter(ABC):
    """Base of a runtime adapter whose resident model is one spawned HTTP process.

    Subclasses set :attr:`name` and implement :meth:`command`, :meth:`identity_args`,
    :meth:`ready` and :meth:`activity`; they may extend :meth:`before_spawn` (checks and
    engine-side loading before the process starts) and :meth:`after_stop` (engine-side
    release after it stopped).

    Args:
        ready_timeout_s: seconds a child may take to become ready before it is stopped.
        term_grace_s: seconds between SIGTERM and SIGKILL when a child is stopped.
        max_concurrency: requests one child serves in parallel (reported in probes).
    """

    name: str
    label: str = "engine"
    """How messages name the process (``vLLM``, ``Ollama gateway`` …)."""
    log_prefix: str = ""
    """A child's log is ``logs/<log_prefix>-<port>.log`` (:attr:`name` when empty)."""
    embeddings_args: tuple[str, ...] = ()
    """Arguments appended to :meth:`command` for an embedding profile's engine; empty when
    the runtime serves no embeddings endpoint (such a warm is refused)."""

    def __init__(
        self,
        *,
        ready_timeout_s: float,
        term_grace_s: float = TERM_GRACE_S,
        max_concurrency: int | None = None,
    ) -> None:
        self.ready_timeout_s = ready_timeout_s
        self.term_grace_s = term_grace_s
        self.max_concurrency = max_concurrency

    # --- what a runtime supplies ------------------------------------------------------------
    @abstractmethod
    def command(
        self, host: RuntimeHost, loaded: LoadResult, alias: str, port: int, memory_mb: int
    ) -> list[str]:
        """The exact command line of a child (``argv[0]`` an absolute executable path)."""

    @abstractmethod
    def identity_args(self, child: ChildRecord) -> tuple[tuple[str, str], ...]:
        """``(flag, value)`` pairs of the command line that prove a child is this one."""

    @abstractmethod
    async def ready(self, client: httpx.AsyncClient, host: RuntimeHost, child: ChildRecord) -> bool:
        """Whether the child answers its health and model routes (never raises for HTTP)."""

    @abstractmethod
    async def activity(self, host: RuntimeHost, child: ChildRecord) -> int | None:
        """Requests the child is working on; ``None`` when unknown."""

    async def before_spawn(self, host: RuntimeHost, loaded: LoadResult, memory_mb: int) -> None:
        """Checks (and engine-side loading) before the process starts; raise to refuse."""
        return None

    async def after_stop(self, host: RuntimeHost, child: ChildRecord) -> None:
        """Engine-side release after the child stopped (e.g. free accelerator memory)."""
        return None

    # --- identity ---------------------------------------------------------------------------
    def identity(self, child: ChildRecord) -> ProcessIdentity:
        """What proves ``child``: PID, birth, executable and the identity flags."""
        return ProcessIdentity(
            child.pid,
            child.birth,
            executable=child.executable or None,
            args=self.identity_args(child),
        )

    def proof(self, child: ChildRecord) -> Proof:
        """Identity proof of ``child``."""
        return self.identity(child).prove()

    # --- warm -------------------------------------------------------------------------------
    async def warm(
        self,
        host: RuntimeHost,
        loaded: LoadResult,
        memory_mb: int,
        *,
        embeddings: bool = False,
        ready_timeout_s: float | None = None,
    ) -> ChildRecord:
        """Start the child for ``loaded`` and wait until it is ready.

        The record is published right after spawn (pid, port) and again with its executable
        and birth marker before readiness; a failed publication or readiness stops it.

        Raises:
            UnavailableError: the child exited or did not become ready in time.
            StateError: the child could not be recorded durably (it was stopped).
            ValidationError: ``embeddings`` asked of a runtime without that endpoint
                (:attr:`embeddings_args` empty).
            GridError: whatever :meth:`before_spawn` refused with.
        """
        self._check_embeddings(embeddings)
        await self.before_spawn(host, loaded, memory_mb)
        port = host.allocate_port()
        alias = loaded.model_id
        logs = host.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        log_path = logs / f"{self.log_prefix or self.name}-{port}.log"
        argv = self.child_command(host, loaded, alias, port, memory_mb, embeddings=embeddings)
        pid = spawn_detached(argv, log_path=log_path, truncate_log=True)
        child = ChildRecord(
            runtime=self.name,
            model_id=loaded.model_id,
            alias=alias,
            pid=pid,
            port=port,
            host=host.bind_host,
            model_path=loaded.path,
            artifact_sha256=loaded.sha256,
            memory_mb=memory_mb,
            started_at=time.time(),
        )
        try:
            host.publish(child)
            child.birth = birth_of(pid)
            child.executable = exe_of(pid) or argv[0]
            if child.birth is None:
                msg = f"{self.label} for {alias} exited at once; log: {log_tail(log_path)}"
                raise UnavailableError(msg)
            host.publish(child)
        except (StateError, OSError, UnavailableError) as exc:
            await self._stop_spawned(pid)
            self._record_failure(host, child, str(exc))
            if isinstance(exc, GridError):
                raise
            msg = f"could not record the {self.label} of {alias} durably ({exc}); it was stopped"
            raise StateError(msg) from exc
        try:
            await self._wait_ready(host, child, log_path, ready_timeout_s or self.ready_timeout_s)
        except GridError as exc:
            await self._stop_spawned(pid)
            self._record_failure(host, child, str(exc))
            raise
        child.state = "ready"
        host.publish(child)
        return child

    def child_command(
        self,
        host: RuntimeHost,
        loaded: LoadResult,
        alias: str,
        port: int,
        memory_mb: int,
        *,
        embeddings: bool = False,
    ) -> list[str]:
        """:meth:`command`, plus :attr:`embeddings_args` for an embedding profile's engine.

        Raises:
            ValidationError: ``embeddings`` asked of a runtime without that endpoint.
        """
        self._check_embeddings(embeddings)
        argv = self.command(host, loaded, alias, port, memory_mb)
        return [*argv, *self.embeddings_args] if embeddings else argv

    def _check_embeddings(self, embeddings: bool) -> None:
        if embeddings and not self.embeddings_args:
            msg = (
                f"runtime {self.name!r} serves no embeddings endpoint here; give the embedding "
                "profile --runtime llama.cpp"
            )
            raise ValidationError(msg)

    @staticmethod
    def _record_failure(host: RuntimeHost, child: ChildRecord, why: str) -> None:
        child.state = "failed"
        child.failure = why[:500]
        with contextlib.suppress(GridError, OSError):
            host.publish(child)

    async def _stop_spawned(self, pid: int) -> None:
        # Our unreaped child: its PID cannot have been reused yet.
        with contextlib.suppress(GridError):
            await stop_process(SpawnedChild(pid), grace_s=self.term_grace_s)

    async def _wait_ready(
        self, host: RuntimeHost, child: ChildRecord, log_path: Path, timeout_s: float
    ) -> None:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, trust_env=False) as client:

            async def ready() -> bool:
                if reap(child.pid) or is_gone(child.pid):
                    msg = (
                        f"{self.label} for {child.alias} exited before ready; "
                        f"log: {log_tail(log_path)}"
                    )
                    raise UnavailableError(msg)
                return await self.ready(client, host, child)

            if await wait_until(ready, timeout_s=timeout_s, interval_s=POLL_INTERVAL_S):
                return
        msg = (
            f"{self.label} for {child.alias} not ready after {timeout_s:.0f} s; "
            f"log: {log_tail(log_path)}"
        )
        raise UnavailableError(msg)

    # --- probe ------------------------------------------------------------------------------
    async def probe(self, host: RuntimeHost, child: ChildRecord) -> Probe:
        """Identity, readiness and activity of one child."""
        proof = await asyncio.to_thread(self.proof, child)
        if proof.status != "proven":
            return Probe(alive=False, ready=False, detail=proof.reason)
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, trust_env=False) as client:
            ready = await self.ready(client, host, child)
        active = await self.activity(host, child) if ready else None
        return Probe(
            alive=True,
            ready=ready,
            active_requests=active,
            max_concurrency=self.max_concurrency,
            detail="" if ready else "not answering readiness checks",
        )

    # --- drain / unload ---------------------------------------------------------------------
    async def drain(self, host: RuntimeHost, child: ChildRecord, deadline_s: float) -> int | None:
        """Wait (the route is already fenced) until the child is idle or ``deadline_s`` passes.

        Returns:
            Requests still running at the end (0 = idle), ``None`` when activity is unknown.
        """
        last: list[int | None] = [await self.activity(host, child)]
        if last[0] == 0 or deadline_s <= 0:
            return last[0]

        async def idle() -> bool:
            last[0] = await self.activity(host, child)
            return last[0] == 0

        await wait_until(idle, timeout_s=deadline_s, interval_s=POLL_INTERVAL_S)
        return last[0]

    async def unload(
        self, host: RuntimeHost, child: ChildRecord, *, idle_wait_s: float, force: bool = False
    ) -> None:
        """Stop a proven child once idle, then release engine-side memory.

        Raises:
            ForbiddenError: the child's identity is not proven (it is never signalled).
            UnavailableError: still busy (or activity unknown) after ``idle_wait_s`` without
                ``force`` (left running), or it outlived SIGKILL.
        """
        proof = await asyncio.to_thread(self.proof, child)
        if proof.status == "dead":
            reap(child.pid)
            await self.after_stop(host, child)
            return
        if proof.status != "proven":
            msg = f"refusing to stop {child.alias} (pid {child.pid}): {proof.reason}"
            raise ForbiddenError(msg)
        if not force:
            left = await self.drain(host, child, idle_wait_s)
            if left != 0:
                what = "unknown activity" if left is None else f"{left} request(s) in flight"
                msg = (
                    f"{child.alias} still has {what} after {idle_wait_s:.0f} s; left running "
                    "(drain again later, or stop with force)"
                )
                raise UnavailableError(msg)
        await stop_process(self.identity(child), grace_s=self.term_grace_s)
        await self.after_stop(host, child)

    # --- adopt ------------------------------------------------------------------------------
    async def adopt(self, host: RuntimeHost, child: ChildRecord) -> tuple[AdoptOutcome, str]:
        """After a node restart: adopt a proven ready child, release a dead one, fence the rest."""
        proof = await asyncio.to_thread(self.proof, child)
        if proof.status == "dead":
            return "dead", proof.reason
        if proof.status != "proven":
            return "fenced", proof.reason
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, trust_env=False) as client:
            if await self.ready(client, host, child):
                return "adopted", "identity and readiness proven"
        return "fenced", "identity proven but the engine does not answer readiness checks"


async def lists_model(
    client: httpx.AsyncClient, base_url: str, api_key: str, alias: str, *, health: str = "/health"
) -> bool:
    """``GET health`` answers 200 and the authenticated ``/v1/models`` lists ``alias``.

    The readiness check of an OpenAI-compatible engine; any transport error is "not ready".
    """
    try:
        h = await client.get(f"{base_url}{health}")
        if h.status_code != 200:
            return False
        r = await client.get(
            f"{base_url}/v1/models", headers={"Authorization": f"Bearer {api_key}"}
        )
        if r.status_code != 200:
            return False
        ids = {m.get("id") for m in r.json().get("data", [])}
    except (httpx.HTTPError, ValueError, AttributeError):
        return False
    return alias in ids
