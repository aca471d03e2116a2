"""The runtime-adapter contract: how a node drives one engine family's lifecycle.

A runtime adapter (registered through the ``grid_runtime_adapters`` hook) owns LOAD → WARM →
READY → DRAIN → UNLOAD for its engine family on one node, plus ``adopt`` after a node restart
and ``qualify`` (the real lifecycle check behind ``grid allocator qualify <runtime>``).
Lifecycle authority comes only from an adapter that started the process or proved its
identity (specification, "Managed host actuator").

This module holds only types; the node (``grid_node``) supplies the :class:`RuntimeHost`
and calls the async methods. pluggy hooks stay synchronous; async work lives on the adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import msgspec

ChildState = Literal["starting", "ready", "draining", "failed"]


class ArtifactSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a load must produce on disk.

    Attributes:
        model_id: the model (for GGUF models, its file name).
        sha256: the declared immutable digest (lowercase hex) or ``None``.
        source: an exact fetch source (``hf://owner/repo/path.gguf``) or ``None``.
        size_mb: the artifact size ceiling in MB; required with ``source``.
    """

    model_id: str
    sha256: str | None = None
    source: str | None = None
    size_mb: int | None = None


class LoadResult(msgspec.Struct, frozen=True, kw_only=True):
    """A verified artifact on local disk.

    Attributes:
        model_id: the model.
        path: absolute path of the file.
        sha256: the digest that was proved (``None`` when none was declared).
        size_bytes: file size in bytes.
        fetched: true only when a transfer really happened during this load.
    """

    model_id: str
    path: str
    sha256: str | None = None
    size_bytes: int = 0
    fetched: bool = False


class ChildRecord(msgspec.Struct, kw_only=True):
    """One engine child process as the node persists it (every identity field is proof).

    Attributes:
        runtime: adapter name.
        model_id / alias: the model and the name the engine serves it under.
        pid / port: process id and listening port on ``host``.
        executable: resolved engine executable path.
        model_path: the weights file passed to the engine.
        birth: process creation time (psutil ``create_time``, seconds): the birth marker
            that defeats PID reuse; ``None`` until enriched after spawn.
        state: starting, ready, draining or failed.
        artifact_sha256: digest proved before launch, if declared.
        memory_mb: resident budget the controller asked for.
        started_at: wall-clock Unix seconds of the spawn.
        failure: why the child is failed (empty otherwise).
    """

    runtime: str
    model_id: str
    alias: str
    pid: int
    port: int
    host: str = "127.0.0.1"
    executable: str = ""
    model_path: str = ""
    birth: float | None = None
    state: ChildState = "starting"
    artifact_sha256: str | None = None
    memory_mb: int = 0
    started_at: float = 0.0
    failure: str = ""

    @property
    def url(self) -> str:
        """Base URL of the engine's HTTP API."""
        return f"http://{self.host}:{self.port}"

    @property
    def fenced(self) -> bool:
        """Whether the node gave this child up without proof of its identity (after a restart,
        or a hung engine it could not stop): it is never signalled or routed to again."""
        return self.state == "failed" and self.failure.startswith("fenced")


class Probe(msgspec.Struct, frozen=True, kw_only=True):
    """A health observation of one child.

    Attributes:
        alive: the process exists and its identity is proven.
        ready: the engine answered its readiness checks.
        active_requests: requests being processed, ``None`` when unknown.
        max_concurrency: parallel slots the engine serves, ``None`` when unknown.
        detail: one line for status when something is off.
    """

    alive: bool
    ready: bool
    active_requests: int | None = None
    max_concurrency: int | None = None
    detail: str = ""


AdoptOutcome = Literal["adopted", "dead", "fenced"]
"""adopted: proven and ready; dead: the process is gone (release the handle); fenced: alive
but unprovable or unready, kept in failed state and never signalled."""


class RuntimeHost(Protocol):
    """What the node offers an adapter (paths, ports, the engine key, durable publication)."""

    bind_host: str
    """Address engine children listen on (loopback unless configured)."""
    state_dir: Path
    artifact_dir: Path
    model_dirs: tuple[Path, ...]
    api_key: str
    """The per-host engine API key (never put in argv or a child's environment)."""
    api_key_file: Path
    """One-key-per-line file (mode 0600) passed to the engine."""

    def allocate_port(self) -> int:
        """A free port from the managed range (raises UnavailableError when none is free)."""
        ...

    def publish(self, child: ChildRecord) -> None:
        """Durably record ``child``; raises StateError (the adapter then stops the child)."""
        ...


@runtime_checkable
class RuntimeAdapter(Protocol):
    """One engine family's lifecycle on a node. All methods are coroutines.

    Errors are :class:`grid_core.errors.GridError` subclasses whose message becomes the
    acknowledgement message.
    """

    name: str

    async def load(self, host: RuntimeHost, artifact: ArtifactSpec) -> LoadResult:
        """Verify a local artifact or fetch the exact declared one."""
        ...

    async def warm(
        self,
        host: RuntimeHost,
        loaded: LoadResult,
        memory_mb: int,
        *,
        embeddings: bool = False,
        ready_timeout_s: float | None = None,
    ) -> ChildRecord:
        """Start the engine for ``loaded`` and wait until it is ready.

        ``embeddings=True`` (an embedding profile) asks for the embeddings endpoint; the node
        passes it only when it is true, so an adapter without embedding support may omit it.
        ``ready_timeout_s`` is the controller's readiness deadline for this start (from the
        profile's warm estimate and the learned warm time, issue 20): the adapter waits that
        long, not its own default, before it stops the engine and fails; the node passes it
        whenever the command carries one.
        """
        ...

    async def probe(self, host: RuntimeHost, child: ChildRecord) -> Probe:
        """Identity, readiness and activity of one child."""
        ...

    async def drain(self, host: RuntimeHost, child: ChildRecord, deadline_s: float) -> int | None:
        """Wait up to ``deadline_s`` seconds for the child to go idle; returns requests left."""
        ...

    async def unload(
        self, host: RuntimeHost, child: ChildRecord, *, idle_wait_s: float, force: bool = False
    ) -> None:
        """Stop a proven, idle child (refuses unprovable or busy ones unless forced)."""
        ...

    async def adopt(self, host: RuntimeHost, child: ChildRecord) -> tuple[AdoptOutcome, str]:
        """Decide what to do with a persisted child after a node restart."""
        ...


RUNTIME_ADAPTER_METHODS = ("load", "warm", "probe", "drain", "unload", "adopt")
"""The lifecycle coroutines every adapter provides (checked when the adapter registers)."""


@runtime_checkable
class GpuDevice(Protocol):
    """One accelerator a ``grid_gpu_devices`` plugin reports on this host.

    :class:`grid_core.wire.GpuDevice` is a conforming value; any object with these attributes
    is accepted.
    """

    index: int
    """Device index as the vendor tool numbers it."""
    name: str
    memory_total_mb: int
    memory_used_mb: int | None
    """``None`` when the driver does not report usage."""


Publisher = Callable[[ChildRecord], None]
