"""The llama.cpp runtime adapter: one Grid-owned ``llama-server`` child per model.

Launch: ``--model --alias --host --port --api-key-file --slots`` (the key lives only in a
0600 file; never in argv or the child's environment). Readiness is ``/health`` 200 plus the
alias in the authenticated model listing; activity is the number of busy entries in the
authenticated ``/slots``. Unload sends SIGTERM to an identity-proven child, waits a bounded
time and escalates to SIGKILL only while the proof still holds (specification, "Managed host
actuator").
"""

from __future__ import annotations

import asyncio
import contextlib
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
    Probe,
    ProcessIdentity,
    Proof,
    RuntimeHost,
    SpawnedChild,
    StateError,
    UnavailableError,
    birth_of,
    exe_of,
    is_gone,
    reap,
    spawn_detached,
    stop_process,
    wait_until,
)
from grid_llamacpp.artifacts import ArtifactStore
from grid_llamacpp.install import find_llama_server

RUNTIME_NAME = "llama.cpp"
READY_TIMEOUT_S = 180.0
"""Seconds a child may take to load weights and answer /health (a multi-GB GGUF from a cold
disk on a laptop takes about a minute; three leaves margin)."""
PROBE_TIMEOUT_S = 5.0
"""Seconds for one HTTP probe of a local child; loopback answers in milliseconds."""
POLL_INTERVAL_S = 0.1
"""Readiness/idle polling period: fast enough that a tiny model is ready in ~0.2 s."""
TERM_GRACE_S = 15.0
"""Seconds after SIGTERM before a still-proven child is killed; llama-server exits in well
under a second once idle."""
DEFAULT_PARALLEL = 4
"""Server slots per child: concurrent requests one engine serves (its max_concurrency)."""
QUALIFY_TIMEOUT_S = 120.0
"""Seconds one qualification completion may take on a slow CPU."""
LOG_TAIL_BYTES = 2000
"""Bytes of a failed child's log quoted in the error message."""


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-LOG_TAIL_BYTES:]
    except OSError:
        return ""
    return data.decode(errors="replace").strip().replace("\n", " | ")[-500:]


class LlamaCppAdapter:
    """Runtime adapter for llama.cpp's ``llama-server``.

    Args:
        executable: explicit ``llama-server`` path (else GRID_LLAMA_SERVER, PATH, cache).
        parallel: server slots per child.
        ctx_size: context size per child in tokens (0 = the model's own).
        ready_timeout_s: seconds a child may take to become ready before it is stopped.
        term_grace_s: seconds between SIGTERM and SIGKILL when a child is stopped.
    """

    name = RUNTIME_NAME

    def __init__(
        self,
        executable: str | None = None,
        parallel: int = DEFAULT_PARALLEL,
        ctx_size: int = 0,
        *,
        ready_timeout_s: float = READY_TIMEOUT_S,
        term_grace_s: float = TERM_GRACE_S,
    ) -> None:
        self._configured = executable
        self.parallel = parallel
        self.ctx_size = ctx_size
        self.ready_timeout_s = ready_timeout_s
        self.term_grace_s = term_grace_s

    def use_executable(self, executable: str) -> None:
        """Run ``executable`` as llama-server (the node's ``--llama-server`` option)."""
        self._configured = executable

    def executable(self) -> Path:
        """The resolved ``llama-server`` (raises NotFoundError with the install hint)."""
        return find_llama_server(self._configured)

    def inventory(self) -> str:
        """The ``llama-server`` this host runs (raises NotFoundError with the install hint)."""
        return f"llama-server {self.executable()}"

    async def infer(self, host: RuntimeHost, child: ChildRecord) -> str:
        """One real chat completion through the child (qualification).

        Raises:
            UnavailableError: the engine did not answer with generated tokens.
        """
        async with httpx.AsyncClient(timeout=QUALIFY_TIMEOUT_S) as client:
            r = await client.post(
                f"{child.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {host.api_key}"},
                json={
                    "model": child.alias,
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "hi"}],
                },
            )
        usage = r.json().get("usage", {}) if r.status_code == 200 else {}
        tokens = usage.get("completion_tokens", 0)
        if not tokens:
            msg = f"chat completion on {child.alias}: HTTP {r.status_code}, no tokens"
            raise UnavailableError(msg)
        return f"HTTP 200, {tokens} tokens"

    # --- load ---------------------------------------------------------------------------
    async def load(self, host: RuntimeHost, artifact: ArtifactSpec) -> LoadResult:
        """Verify a local GGUF or fetch the exact declared source (off the event loop)."""
        store = ArtifactStore(host.artifact_dir, host.model_dirs)
        return await asyncio.to_thread(store.resolve, artifact)

    # --- warm ---------------------------------------------------------------------------
    def argv(
        self,
        exe: Path,
        model_path: str,
        alias: str,
        bind: str,
        port: int,
        key_file: Path,
        *,
        embeddings: bool = False,
    ) -> list[str]:
        """The exact command line of a child (the identity proof checks these pairs).

        ``embeddings`` enables ``/v1/embeddings`` (an embedding profile's engine).
        """
        argv = [
            str(exe),
            "--model",
            model_path,
            "--alias",
            alias,
            "--host",
            bind,
            "--port",
            str(port),
            "--api-key-file",
            str(key_file),
            "--slots",
            "--parallel",
            str(self.parallel),
            "--no-webui",
        ]
        if self.ctx_size:
            argv += ["--ctx-size", str(self.ctx_size)]
        if embeddings:
            argv.append("--embeddings")
        return argv

    async def warm(
        self, host: RuntimeHost, loaded: LoadResult, memory_mb: int, *, embeddings: bool = False
    ) -> ChildRecord:
        """Start ``llama-server`` for ``loaded`` and wait for readiness.

        The child is published durably right after spawn (pid, port) and again with its
        executable and birth marker before readiness; a failed publication stops it.

        Raises:
            ValidationError: the declared digest no longer matches the file.
            UnavailableError: the child exited or did not become ready in time.
            StateError: the child could not be recorded (it was stopped).
        """
        store = ArtifactStore(host.artifact_dir, host.model_dirs)
        if loaded.sha256 is not None:
            await asyncio.to_thread(store.verify, Path(loaded.path), loaded.sha256, loaded.model_id)
        exe = self.executable()
        port = host.allocate_port()
        alias = loaded.model_id
        logs = host.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        log_path = logs / f"llama-{port}.log"
        argv = self.argv(
            exe, loaded.path, alias, host.bind_host, port, host.api_key_file, embeddings=embeddings
        )
        # The key lives only in the 0600 key file; credential variables are not inherited.
        pid = spawn_detached(argv, log_path=log_path)
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
            child.executable = exe_of(pid) or str(exe)
            if child.birth is None:
                msg = f"llama-server for {alias} exited at once; log: {_tail(log_path)}"
                raise UnavailableError(msg)
            host.publish(child)
        except (StateError, OSError, UnavailableError) as exc:
            await self._stop_spawned(pid)
            self._record_failure(host, child, str(exc))
            if isinstance(exc, GridError):
                raise
            msg = f"could not record child of {alias} durably ({exc}); it was stopped"
            raise StateError(msg) from exc
        try:
            await self._wait_ready(host, child, log_path)
        except GridError as exc:
            await self._stop_spawned(pid)
            self._record_failure(host, child, str(exc))
            raise
        child.state = "ready"
        host.publish(child)
        return child

    @staticmethod
    def _record_failure(host: RuntimeHost, child: ChildRecord, why: str) -> None:
        """Best-effort: mark a stopped child failed so the next warm can release it."""
        child.state = "failed"
        child.failure = why[:500]
        with contextlib.suppress(GridError, OSError):
            host.publish(child)

    async def _stop_spawned(self, pid: int) -> None:
        """Stop a child this adapter spawned moments ago, without blocking the event loop.

        Being our unreaped child is its proof (its PID cannot be reused before we reap it).
        SIGTERM, up to ``term_grace_s`` seconds, then SIGKILL; heartbeats keep flowing.
        """
        with contextlib.suppress(GridError):
            await stop_process(SpawnedChild(pid), grace_s=self.term_grace_s)

    async def _wait_ready(self, host: RuntimeHost, child: ChildRecord, log_path: Path) -> None:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:

            async def ready() -> bool:
                if reap(child.pid) or is_gone(child.pid):
                    msg = (
                        f"llama-server for {child.alias} exited before ready; "
                        f"log: {_tail(log_path)}"
                    )
                    raise UnavailableError(msg)
                return await self._ready(client, host, child)

            if await wait_until(ready, timeout_s=self.ready_timeout_s, interval_s=POLL_INTERVAL_S):
                return
        msg = f"llama-server for {child.alias} not ready after {self.ready_timeout_s:.0f} s"
        raise UnavailableError(msg)

    async def _ready(
        self, client: httpx.AsyncClient, host: RuntimeHost, child: ChildRecord
    ) -> bool:
        try:
            health = await client.get(f"{child.url}/health")
            if health.status_code != 200:
                return False
            models = await client.get(
                f"{child.url}/v1/models", headers={"Authorization": f"Bearer {host.api_key}"}
            )
        except httpx.HTTPError:
            return False
        if models.status_code != 200:
            return False
        ids = {m.get("id") for m in models.json().get("data", [])}
        return child.alias in ids

    # --- probe / activity -----------------------------------------------------------------
    @staticmethod
    def identity(child: ChildRecord) -> ProcessIdentity:
        """What proves ``child``: PID, birth, executable, model path, alias and port."""
        return ProcessIdentity(
            child.pid,
            child.birth,
            executable=child.executable or None,
            args=(
                ("--model", child.model_path),
                ("--alias", child.alias),
                ("--port", str(child.port)),
            ),
        )

    def proof(self, child: ChildRecord) -> Proof:
        """Identity proof of ``child`` (see :meth:`identity`)."""
        return self.identity(child).prove()

    async def activity(self, host: RuntimeHost, child: ChildRecord) -> int | None:
        """Busy slots from authenticated ``/slots``; ``None`` when unknown."""
        try:
            async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
                r = await client.get(
                    f"{child.url}/slots", headers={"Authorization": f"Bearer {host.api_key}"}
                )
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        try:
            return sum(1 for s in r.json() if s.get("is_processing"))
        except (ValueError, AttributeError, TypeError):
            return None

    async def probe(self, host: RuntimeHost, child: ChildRecord) -> Probe:
        """Identity, readiness and activity of one child."""
        proof = await asyncio.to_thread(self.proof, child)
        if proof.status != "proven":
            return Probe(alive=False, ready=False, detail=proof.reason)
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
            ready = await self._ready(client, host, child)
        active = await self.activity(host, child) if ready else None
        return Probe(
            alive=True,
            ready=ready,
            active_requests=active,
            max_concurrency=self.parallel,
            detail="" if ready else "not answering readiness checks",
        )

    # --- drain / unload -------------------------------------------------------------------
    async def drain(self, host: RuntimeHost, child: ChildRecord, deadline_s: float) -> int | None:
        """Wait (the route is already fenced) until no slot is busy or ``deadline_s`` passes.

        Returns:
            Requests still running at the end (0 = idle), ``None`` when activity is unknown.
        """
        # Measure once before waiting: with ``deadline_s`` 0 (fence only) the wait below would
        # cancel its first probe at once and report unknown activity for a busy engine.
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
        """Stop a proven child after it is idle.

        SIGTERM, up to ``term_grace_s`` seconds, then SIGKILL while the proof still holds.

        Raises:
            ForbiddenError: the child's identity is not proven (it is never signalled).
            UnavailableError: it stayed busy (or activity unknown) for ``idle_wait_s``
                without ``force``; it is left running. Or it outlived SIGKILL.
        """
        proof = await asyncio.to_thread(self.proof, child)
        if proof.status == "dead":
            reap(child.pid)
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

    # --- adopt ----------------------------------------------------------------------------
    async def adopt(self, host: RuntimeHost, child: ChildRecord) -> tuple[AdoptOutcome, str]:
        """After a node restart: adopt a proven ready child, release a dead one, fence the rest.

        A fenced child keeps its record in failed state and is never signalled.
        """
        proof = await asyncio.to_thread(self.proof, child)
        if proof.status == "dead":
            return "dead", proof.reason
        if proof.status != "proven":
            return "fenced", proof.reason
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
            if await self._ready(client, host, child):
                return "adopted", "identity and readiness proven"
        return "fenced", "identity proven but the engine does not answer readiness checks"
