"""The llama.cpp runtime adapter: one Grid-owned ``llama-server`` child per model.

Launch: ``--model --alias --host --port --api-key-file --slots`` (the key lives only in a
0600 file; never in argv or the child's environment). Readiness is ``/health`` 200 plus the
alias in the authenticated model listing; activity is the number of busy entries in the
authenticated ``/slots``. The lifecycle itself (durable record before waiting, identity proof
before any signal, SIGTERM then SIGKILL only while the proof holds, adoption after a node
restart) is the shared :class:`~grid_core.api.EngineChildAdapter` (specification, "Managed
host actuator").
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from grid_core.api import (
    ArtifactSpec,
    ChildRecord,
    EngineChildAdapter,
    LoadResult,
    RuntimeHost,
    UnavailableError,
    lists_model,
)
from grid_llamacpp.artifacts import ArtifactStore
from grid_llamacpp.install import find_llama_server

RUNTIME_NAME = "llama.cpp"
READY_TIMEOUT_S = 180.0
"""Seconds a child may take to load weights and answer /health (a multi-GB GGUF from a cold
disk on a laptop takes about a minute; three leaves margin)."""
PROBE_TIMEOUT_S = 5.0
"""Seconds for one HTTP probe of a local child; loopback answers in milliseconds."""
TERM_GRACE_S = 15.0
"""Seconds after SIGTERM before a still-proven child is killed; llama-server exits in well
under a second once idle."""
DEFAULT_PARALLEL = 4
"""Server slots per child: concurrent requests one engine serves (its max_concurrency)."""
QUALIFY_TIMEOUT_S = 120.0
"""Seconds one qualification completion may take on a slow CPU."""


class LlamaCppAdapter(EngineChildAdapter):
    """Runtime adapter for llama.cpp's ``llama-server``.

    Args:
        executable: explicit ``llama-server`` path (else GRID_LLAMA_SERVER, PATH, cache).
        parallel: server slots per child.
        ctx_size: context size per child in tokens (0 = the model's own).
        ready_timeout_s: seconds a child may take to become ready before it is stopped.
        term_grace_s: seconds between SIGTERM and SIGKILL when a child is stopped.
    """

    name = RUNTIME_NAME
    label = "llama-server"
    log_prefix = "llama"
    embeddings_args = ("--embeddings",)

    def __init__(
        self,
        executable: str | None = None,
        parallel: int = DEFAULT_PARALLEL,
        ctx_size: int = 0,
        *,
        ready_timeout_s: float = READY_TIMEOUT_S,
        term_grace_s: float = TERM_GRACE_S,
    ) -> None:
        super().__init__(
            ready_timeout_s=ready_timeout_s, term_grace_s=term_grace_s, max_concurrency=parallel
        )
        self._configured = executable
        self.parallel = parallel
        self.ctx_size = ctx_size

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
    ) -> list[str]:
        """The exact command line of a child (the identity proof checks these pairs)."""
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
        return argv

    def command(
        self, host: RuntimeHost, loaded: LoadResult, alias: str, port: int, memory_mb: int
    ) -> list[str]:
        """``llama-server`` serving ``loaded`` as ``alias`` (the base class appends
        ``--embeddings`` for an embedding profile's engine, which enables ``/v1/embeddings``)."""
        del memory_mb  # llama-server sizes itself from the model and context
        return self.argv(
            self.executable(), loaded.path, alias, host.bind_host, port, host.api_key_file
        )

    async def before_spawn(self, host: RuntimeHost, loaded: LoadResult, memory_mb: int) -> None:
        """Re-verify the declared digest (off the event loop) and resolve ``llama-server``.

        Raises:
            ValidationError: the file no longer matches its declared SHA-256.
            NotFoundError: no ``llama-server`` is installed (with the install hint).
        """
        if loaded.sha256 is not None:
            store = ArtifactStore(host.artifact_dir, host.model_dirs)
            await asyncio.to_thread(store.verify, Path(loaded.path), loaded.sha256, loaded.model_id)
        self.executable()

    def identity_args(self, child: ChildRecord) -> tuple[tuple[str, str], ...]:
        """Model path, alias and port: the pairs of the command line that prove a child."""
        return (
            ("--model", child.model_path),
            ("--alias", child.alias),
            ("--port", str(child.port)),
        )

    # --- readiness / activity -----------------------------------------------------------
    async def ready(self, client: httpx.AsyncClient, host: RuntimeHost, child: ChildRecord) -> bool:
        """``/health`` answers 200 and the authenticated ``/v1/models`` lists the alias."""
        return await lists_model(client, child.url, host.api_key, child.alias)

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
