"""The managed host actuator: executes admitted commands through runtime adapters.

One side effect runs at a time (an asyncio lock) while heartbeats continue on the same event
loop. Every step that matters after a crash is written to the durable state first: the
running action id before it starts, the child record right after spawn, the receipt after it
ends (specification, "Managed host actuator").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from grid_core.demand.prefetch import PREDICTIVE_FETCH, PREDICTIVE_FLOOR_MB
from grid_core.errors import GridError, UnavailableError
from grid_core.nodeconfig import NodeConfig
from grid_core.protection import ProtectionDecision
from grid_core.runtime import ArtifactSpec, ChildRecord, Probe, RuntimeAdapter
from grid_core.system.runtime_host import LocalRuntimeHost
from grid_core.wire import (
    Acknowledgement,
    AckStatus,
    CachedArtifact,
    Command,
    Residency,
    ResidencyState,
)
from grid_node import admission
from grid_node.state import NodeState, PredictiveDownload, Receipt, StateFile

log = logging.getLogger("grid.node")

DRAIN_WAIT_S = 60.0
"""Seconds a drain waits for running requests after fencing the route before reporting; the
unload that follows waits again, so a long request is never cut."""
UNLOAD_IDLE_WAIT_S = 120.0
"""Seconds an unload waits for the child to go idle before failing safe (left running)."""
HUNG_AFTER_S = 15.0
"""Seconds a proven-alive ready (or draining) child may fail every readiness probe before it
is declared hung, taken out of routing and force-stopped. llama-server answers ``/health``
from its HTTP thread even with every slot busy, so a long run of failed probes means the
process is stopped (SIGSTOP) or wedged, not merely loaded; three 5 s probes at the default
heartbeat interval cannot be one slow sample."""
MB = 1024 * 1024
MAX_EVENTS = 50
"""Notable events kept in memory for status: the last few minutes of a busy node."""

RESIDENCY_OF_CHILD: dict[str, ResidencyState] = {
    "starting": "warming",
    "ready": "ready",
    "draining": "draining",
    "failed": "failed",
}


@dataclass
class Actuator:
    """Runs commands for one node and owns its children's records.

    Args:
        config: node configuration.
        store: durable state file.
        state: loaded state (mutated in place and saved after every change).
        adapters: runtime adapters by name.
        on_route_change: awaited after a child becomes ready or is fenced/removed, so the
            agent can (de)register engine routes before the next step.
    """

    config: NodeConfig
    store: StateFile
    state: NodeState
    adapters: Mapping[str, RuntimeAdapter]
    on_route_change: Callable[[], Awaitable[None]] | None = None
    reserved_ports: Callable[[], set[int]] = field(default=set)
    """Ports the node holds for other listeners (its TLS fronts): never given to an engine."""
    advertise: Callable[[ChildRecord], str | None] | None = None
    """The URL the server reaches a child at (its TLS front); ``None``: the child's own."""
    events: list[str] = field(default_factory=list)
    probes: dict[str, Probe] = field(default_factory=dict)
    hung_after_s: float = HUNG_AFTER_S
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _unready_since: dict[str, float] = field(default_factory=dict)
    _stopping: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.host = LocalRuntimeHost(
            bind_host=self.config.bind_host,
            state_dir=self.config.state_dir,
            artifact_dir=self.config.artifact_dir,
            model_dirs=self.config.model_dirs,
            api_key=self.state.engine_api_key,
            api_key_file=self.store.key_path,
            port_range=self.config.port_range,
            publish_fn=self._publish,
            used_ports=lambda: (
                {c.port for c in self.state.children.values()} | self.reserved_ports()
            ),
        )

    # --- persistence --------------------------------------------------------------------
    def save(self) -> None:
        """Write the state durably."""
        self.store.save(self.state)

    def _publish(self, child: ChildRecord) -> None:
        self.state.children[child.model_id] = child
        self.save()

    def note(self, line: str) -> None:
        """Keep a bounded list of notable events for status (each is also a log line)."""
        log.info("%s", line)
        self.events.append(f"{time.strftime('%H:%M:%S')} {line}")
        del self.events[:-MAX_EVENTS]

    def adapter_for(self, runtime: str | None) -> RuntimeAdapter:
        """The adapter for ``runtime`` (default llama.cpp).

        Raises:
            UnavailableError: no such adapter is installed.
        """
        name = runtime or "llama.cpp"
        adapter = self.adapters.get(name)
        if adapter is None:
            msg = (
                f"runtime {name!r} has no adapter on this node (installed: {sorted(self.adapters)})"
            )
            raise UnavailableError(msg)
        return adapter

    # --- restart recovery -------------------------------------------------------------------
    async def recover(self) -> None:
        """After a restart: fail the interrupted action, adopt proven children, fence the rest."""
        if self.state.running_action:
            ack = Acknowledgement(
                action_id=self.state.running_action,
                status="failed",
                message="interrupted by a node restart",
                observed_at=time.time(),
            )
            self.state.add_receipt(
                Receipt(ack=ack, kind=self.state.running_kind, model_id=self.state.running_model)
            )
            self.note(f"action {self.state.running_action} marked failed (interrupted)")
            self.state.running_action = None
        for model_id, child in list(self.state.children.items()):
            if child.fenced:
                adapter = self.adapter_for(child.runtime)
                outcome, why = await adapter.adopt(self.host, child)
                if outcome == "dead":
                    del self.state.children[model_id]
                continue
            adapter = self.adapter_for(child.runtime)
            outcome, why = await adapter.adopt(self.host, child)
            if outcome == "adopted":
                if child.state == "starting":
                    child.state = "ready"
                self.note(f"adopted {model_id} pid {child.pid} ({why})")
            elif outcome == "dead":
                del self.state.children[model_id]
                self.note(f"released {model_id}: {why}")
            else:
                child.state = "failed"
                child.failure = f"fenced after restart: {why}"
                self.note(f"fenced {model_id} pid {child.pid}: {why} (never signalled)")
        self.save()

    # --- health -------------------------------------------------------------------------------
    async def refresh(self) -> bool:
        """Probe every child in parallel; a vanished or hung one becomes ``failed``.

        Runs without the command lock so heartbeats stay responsive during a long warm or
        drain; a result is committed only if the child's record is still the one probed and
        no running command is working on that model. A proven-alive child that failed every
        readiness probe for :attr:`hung_after_s` is hung: marked failed (its route is
        withdrawn at the next route sync) and force-stopped by proven identity in the
        background (:meth:`_stop_hung`). Returns True when a child was lost.
        """
        snapshot = [(m, c) for m, c in self.state.children.items() if c.state != "failed"]
        probes = await asyncio.gather(
            *(self.adapter_for(c.runtime).probe(self.host, c) for _, c in snapshot)
        )
        changed = False
        now = time.monotonic()
        for (model_id, child), probe in zip(snapshot, probes, strict=True):
            if self.state.children.get(model_id) is not child:
                continue  # replaced or removed while probing: the result is stale
            self.probes[model_id] = probe
            busy_here = self._lock.locked() and self.state.running_model == model_id
            serving = child.state in ("ready", "draining")
            if not probe.alive and serving and not busy_here:
                child.state = "failed"
                child.failure = f"process lost: {probe.detail}"
                self.note(f"{model_id} pid {child.pid} exited unexpectedly ({probe.detail})")
                changed = True
            elif probe.alive and not probe.ready and serving and not busy_here:
                since = self._unready_since.setdefault(model_id, now)
                if now - since >= self.hung_after_s:
                    child.state = "failed"
                    child.failure = (
                        f"hung: alive but not answering readiness checks for {now - since:.0f} s"
                    )
                    self.note(f"{model_id} pid {child.pid} {child.failure}; force-stopping it")
                    self._unready_since.pop(model_id, None)
                    self._stopping[model_id] = asyncio.create_task(self._stop_hung(model_id, child))
                    changed = True
            else:
                self._unready_since.pop(model_id, None)
        if changed:
            self.save()
        return changed

    async def _stop_hung(self, model_id: str, child: ChildRecord) -> None:
        """Force-stop a hung child by proven identity and release its record.

        The node decides this itself (the specification's explicit force stop): a hung
        engine serves nobody, and its callers hang until it is gone. An unproven process is
        never signalled; its record stays failed (fenced) for an operator.
        """
        adapter = self.adapter_for(child.runtime)
        try:
            if self.on_route_change is not None:
                await self.on_route_change()  # withdraw the route before the signal
            async with self._lock:
                if self.state.children.get(model_id) is not child:
                    return
                # force: no idle wait (its activity cannot be measured); the adapter sends
                # SIGTERM, then SIGKILL after its grace, each only while the proof holds.
                await adapter.unload(self.host, child, idle_wait_s=0.0, force=True)
                del self.state.children[model_id]
                self.probes.pop(model_id, None)
                self.save()
                self.note(f"{model_id}: hung pid {child.pid} stopped")
        except GridError as exc:
            child.failure = f"fenced: hung and could not be stopped ({exc})"[:500]
            self.save()
            self.note(f"{model_id}: hung pid {child.pid} left alone: {exc}")
        finally:
            self._stopping.pop(model_id, None)
        if self.on_route_change is not None:
            await self.on_route_change()

    # --- inventory ----------------------------------------------------------------------------
    def residencies(self) -> list[Residency]:
        """Residency rows for the allocator envelope (children plus cached artifacts)."""
        now = time.time()
        rows: list[Residency] = []
        for model_id, child in self.state.children.items():
            probe = self.probes.get(model_id)
            active = getattr(probe, "active_requests", None) if probe else None
            rows.append(
                Residency(
                    model_id=model_id,
                    memory_mb=child.memory_mb,
                    state=RESIDENCY_OF_CHILD[child.state],
                    ownership="managed",
                    active_requests=active,
                    max_concurrency=getattr(probe, "max_concurrency", None),
                    loaded_age_s=max(0.0, now - child.started_at) if child.started_at else None,
                    # The server's own watermark of work it routed here, reported back as the
                    # absolute server-clock time it sent (persisted, monotonic): scale-down
                    # cooldown then sees server-routed use, also after either side restarts.
                    last_used_at=self.state.model_last_used_at.get(model_id),
                    artifact_sha256=child.artifact_sha256,
                    runtime=child.runtime,
                    port=child.port,
                    route_url=self._route_url(child) if child.state == "ready" else None,
                )
            )
        for model_id, art in self.state.artifacts.items():
            if model_id not in self.state.children:
                rows.append(
                    Residency(
                        model_id=model_id,
                        memory_mb=0,
                        state="cached",
                        artifact_sha256=art.sha256,
                        runtime=self.state.artifact_runtimes.get(model_id, "llama.cpp"),
                    )
                )
        return rows

    def _route_url(self, child: ChildRecord) -> str | None:
        return self.advertise(child) if self.advertise is not None else child.url

    def cached_artifacts(self) -> list[CachedArtifact]:
        """Artifacts verified on disk; unused predictive downloads carry their provenance."""
        now = time.time()
        out = []
        for m, a in self.state.artifacts.items():
            p = self.state.predictive.get(m)
            predictive = p is not None and p.sha256 == a.sha256 and m not in self.state.children
            out.append(
                CachedArtifact(
                    model_id=m,
                    artifact_sha256=a.sha256,
                    size_mb=(a.size_bytes + MB - 1) // MB,
                    predictive=predictive,
                    cached_age_s=max(0.0, now - p.at) if predictive and p is not None else None,
                )
            )
        return out

    # --- commands -----------------------------------------------------------------------------
    async def execute(
        self, cmd: Command, *, deadline_mono: float, decision: ProtectionDecision
    ) -> Acknowledgement:
        """Admit and run one command; returns its acknowledgement (also kept as a receipt).

        A command already executed returns its stored acknowledgement (idempotent redelivery).
        """
        async with self._lock:
            prior = self.state.receipt(cmd.action_id)
            if prior is not None:
                return prior.ack
            reason = admission.check(
                cmd,
                host_id=self.state.host_id,
                node_id=f"ctl.{self.state.host_id}",
                state=self.state,
                deadline_mono=deadline_mono,
                now_mono=time.monotonic(),
                decision=decision,
            )
            if reason is not None:
                ack = Acknowledgement(
                    action_id=cmd.action_id,
                    status="rejected",
                    message=reason,
                    duration_seconds=0.0,
                    observed_at=time.time(),
                )
                self.state.add_receipt(Receipt(ack=ack, kind=cmd.kind, model_id=cmd.model_id))
                self.save()
                self.note(f"rejected {cmd.kind} {cmd.model_id}: {reason}")
                return ack
            log.info(
                "executing %s %s (reason %s, term %s, action %s)",
                cmd.kind,
                cmd.model_id,
                cmd.reason or "-",
                cmd.controller_term,
                cmd.action_id,
            )
            admission.remember_authority(cmd, self.state)
            self.state.running_action = cmd.action_id
            self.state.running_kind = cmd.kind
            self.state.running_model = cmd.model_id
            self.save()
            started = time.monotonic()
            fetched = False
            status: AckStatus
            try:
                message, fetched = await self._run(cmd)
                status = "succeeded"
            except GridError as exc:
                message, status = str(exc), "failed"
            except OSError as exc:
                message, status = f"{type(exc).__name__}: {exc}", "failed"
            ack = Acknowledgement(
                action_id=cmd.action_id,
                status=status,
                message=message[:1900],
                duration_seconds=time.monotonic() - started,
                artifact_fetched=fetched,
                observed_at=time.time(),
            )
            self.state.running_action = None
            self.state.add_receipt(Receipt(ack=ack, kind=cmd.kind, model_id=cmd.model_id))
            self.save()
            self.note(
                f"{cmd.kind} {cmd.model_id}: {status} in {ack.duration_seconds or 0.0:.1f} s "
                f"({message[:120]})"
            )
        if self.on_route_change is not None:
            await self.on_route_change()
        return ack

    async def _run(self, cmd: Command) -> tuple[str, bool]:
        adapter = self.adapter_for(cmd.runtime)
        spec = ArtifactSpec(
            model_id=cmd.model_id,
            sha256=cmd.artifact_sha256,
            source=cmd.artifact_source,
            size_mb=cmd.artifact_size_mb,
        )
        if cmd.kind == "load":
            self._check_disk(cmd)
            loaded = await adapter.load(self.host, spec)
            self.state.artifacts[cmd.model_id] = loaded
            self.state.artifact_runtimes[cmd.model_id] = adapter.name
            if cmd.reason == PREDICTIVE_FETCH and loaded.fetched and loaded.sha256:
                # Provenance: only a download this prefetch really made is predictive cache.
                self.state.predictive[cmd.model_id] = PredictiveDownload(
                    sha256=loaded.sha256, at=time.time()
                )
            self.save()
            verb = "fetched" if loaded.fetched else "verified"
            return f"{verb} {loaded.path}", loaded.fetched
        if cmd.kind == "warm":
            self.state.predictive.pop(cmd.model_id, None)  # used: ordinary cache from now on
            return await self._warm(cmd, adapter, spec), False
        if cmd.kind == "drain":
            return await self.drain(cmd.model_id), False
        if cmd.kind == "unload":
            # force: the controller's explicit decision after the drain deadline passed.
            return await self.unload(cmd.model_id, force=cmd.force), False
        return self._evict(cmd.model_id), False

    def _check_disk(self, cmd: Command) -> None:
        """Re-check free disk right before a load that may transfer."""
        if cmd.artifact_source is None or cmd.artifact_size_mb is None:
            return
        self.config.artifact_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        free_mb = psutil.disk_usage(str(self.config.artifact_dir)).free // MB
        if cmd.reason == PREDICTIVE_FETCH and free_mb - cmd.artifact_size_mb < PREDICTIVE_FLOOR_MB:
            msg = (
                f"predictive prefetch refused: {free_mb} MB free, the {cmd.artifact_size_mb} MB "
                f"artifact would leave less than the {PREDICTIVE_FLOOR_MB} MB floor"
            )
            raise UnavailableError(msg)
        if free_mb < cmd.artifact_size_mb:
            msg = (
                f"only {free_mb} MB free in {self.config.artifact_dir}, the artifact may be "
                f"{cmd.artifact_size_mb} MB; free disk space first"
            )
            raise UnavailableError(msg)

    async def _warm(self, cmd: Command, adapter: RuntimeAdapter, spec: ArtifactSpec) -> str:
        existing = self.state.children.get(cmd.model_id)
        if existing is not None and existing.state == "ready":
            return f"already ready on port {existing.port}"
        if existing is not None and existing.state != "failed":
            msg = f"{cmd.model_id} is {existing.state}; unload it before warming again"
            raise UnavailableError(msg)
        if existing is not None:
            # A failed record of a dead process is released; a fenced live one blocks.
            outcome, why = await adapter.adopt(self.host, existing)
            if outcome != "dead":
                msg = (
                    f"{cmd.model_id} has a fenced child pid {existing.pid} ({why}); "
                    "inspect it by hand before warming again"
                )
                raise UnavailableError(msg)
            del self.state.children[cmd.model_id]
        loaded = self.state.artifacts.get(cmd.model_id)
        if loaded is None or (spec.sha256 is not None and loaded.sha256 != spec.sha256):
            verify_only = ArtifactSpec(model_id=spec.model_id, sha256=spec.sha256)
            loaded = await adapter.load(self.host, verify_only)
            self.state.artifacts[cmd.model_id] = loaded
            self.state.artifact_runtimes[cmd.model_id] = adapter.name
        available_mb = psutil.virtual_memory().available // MB
        if cmd.memory_mb and available_mb < cmd.memory_mb:
            msg = (
                f"warm {cmd.model_id} needs {cmd.memory_mb} MB, only {available_mb} MB is "
                "free on this host now"
            )
            raise UnavailableError(msg)
        options: dict[str, Any] = {}
        if cmd.embeddings:  # only asked of adapters when a profile needs it
            options["embeddings"] = True
        if cmd.ready_timeout_s is not None:  # the controller's deadline for this start
            options["ready_timeout_s"] = cmd.ready_timeout_s
        child = await adapter.warm(self.host, loaded, cmd.memory_mb, **options)
        return f"ready on port {child.port} (pid {child.pid})"

    async def drain(self, model_id: str, wait_s: float = DRAIN_WAIT_S) -> str:
        """Fence the route of ``model_id`` and wait (bounded) for running requests."""
        child = self.state.children.get(model_id)
        if child is None:
            return "not running (nothing to drain)"
        if child.state == "failed":
            msg = f"{model_id} is failed ({child.failure}); unload it instead"
            raise UnavailableError(msg)
        child.state = "draining"
        self.save()
        if self.on_route_change is not None:
            await self.on_route_change()
        adapter = self.adapter_for(child.runtime)
        left = await adapter.drain(self.host, child, wait_s)
        if left == 0:
            return "route fenced; idle"
        what = "unknown activity" if left is None else f"{left} request(s) still running"
        return f"route fenced; {what}"

    async def unload(
        self, model_id: str, force: bool = False, idle_wait_s: float = UNLOAD_IDLE_WAIT_S
    ) -> str:
        """Stop the child of ``model_id`` (fence, wait idle, SIGTERM, bounded escalation)."""
        child = self.state.children.get(model_id)
        if child is None:
            return "not running"
        if child.state in ("ready", "starting"):
            child.state = "draining"
            self.save()
            if self.on_route_change is not None:
                await self.on_route_change()
        adapter = self.adapter_for(child.runtime)
        await adapter.unload(
            self.host,
            child,
            idle_wait_s=idle_wait_s,
            force=force,
        )
        del self.state.children[model_id]
        self.probes.pop(model_id, None)
        self.save()
        return f"stopped pid {child.pid}"

    def _evict(self, model_id: str) -> str:
        """Delete a cached artifact Grid fetched: a weights file or a snapshot directory
        inside the node's artifact directory (never an operator's own file, never a path
        another cached model still uses).

        Raises:
            UnavailableError: the model is running (unload it first).
        """
        if model_id in self.state.children:
            msg = f"{model_id} is running; unload it before evicting its artifact"
            raise UnavailableError(msg)
        art = self.state.artifacts.pop(model_id, None)
        self.state.artifact_runtimes.pop(model_id, None)
        self.state.predictive.pop(model_id, None)
        if art is None:
            return "not cached"
        path = Path(art.path)
        if any(Path(a.path) == path for a in self.state.artifacts.values()):
            kept = " (kept: another cached model uses it)"
        elif self._delete_fetched(path):
            kept = ""
        else:
            kept = " (kept: the operator's own file)"
        self.save()
        return f"evicted {path}{kept}"

    def _delete_fetched(self, path: Path) -> bool:
        """Remove ``path`` when it is Grid's own download (under the artifact directory,
        reached without leaving it through a symlink); returns whether it was Grid's."""
        root = self.config.artifact_dir.resolve()
        try:
            real = path.resolve(strict=True)
        except (FileNotFoundError, RuntimeError):
            return path.parent == self.config.artifact_dir / "sha256"  # already gone
        if not real.is_relative_to(root) or real == root or path.is_symlink():
            return False
        if real.is_dir():
            shutil.rmtree(real, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                real.unlink()
        return True

    async def stop_all(self, idle_wait_s: float, force: bool = False) -> list[str]:
        """Drain and stop every proven child (``node stop``); returns one line per child."""
        out: list[str] = []
        async with self._lock:
            for model_id in list(self.state.children):
                child = self.state.children[model_id]
                if child.fenced:
                    out.append(f"{model_id}: left alone ({child.failure})")
                    continue
                try:
                    out.append(f"{model_id}: {await self.unload(model_id, force, idle_wait_s)}")
                except GridError as exc:
                    out.append(f"{model_id}: {exc}")
        return out
