"""The node agent: protection loop, heartbeats, engine routes and the command worker.

One event loop runs two tasks: the heartbeat loop (telemetry → protection → routes →
control heartbeat → commands queued) and the worker that executes queued commands one at a
time through the actuator. A long warm or drain never stalls heartbeats.

Heartbeat kinds (specification, "Local wire contract"): right after registering, an early
lease heartbeat; after a route is fenced or the host stops admitting work, a fence heartbeat —
both with ``request_commands=false`` so the server updates registry truth and returns at once.
Only the regular control heartbeat asks for commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

import httpx
import msgspec

from grid_core.client import AsyncGridClient, Call, Calls, RequestRefused
from grid_core.errors import AuthError, ConflictError, GridError, StateError, ValidationError
from grid_core.nodeconfig import NodeConfig
from grid_core.plugins import Plugins
from grid_core.protection import (
    DEFAULT_THROTTLE_FRACTION,
    ProtectionDecision,
    ProtectionPolicy,
    step,
)
from grid_core.runtime import ChildRecord
from grid_core.system import birth_of, grid_home, write_atomic
from grid_core.wire import (
    IDENT_PATTERN,
    MAX_LIST,
    AllocatorEnvelope,
    Capability,
    Command,
    Heartbeat,
    Load,
    NodeRegistration,
    Resources,
    control_record_id,
    engine_record_id,
)
from grid_node import telemetry
from grid_node.actuator import UNLOAD_IDLE_WAIT_S, Actuator
from grid_node.engine_tls import EngineFronts, load_engine_tls
from grid_node.offer import RuntimeOffer
from grid_node.override import read_override
from grid_node.state import NodeState, StateFile

AGENT_FILE = "agent.json"
HTTP_TIMEOUT_S = 15.0
"""Seconds for one request to the server; a heartbeat that takes longer is retried next beat."""
READY_LEASE_BEATS = 3
"""The readiness lease covers this many heartbeat intervals; a dead agent's file goes stale."""
CAPABILITIES: list[Capability] = ["load", "warm", "drain", "unload", "evict"]

T = TypeVar("T")
A = TypeVar("A")


@runtime_checkable
class NamedExecutable(Protocol):
    """A runtime adapter whose engine binary the node configuration may name
    (``--llama-server`` for the ``llama.cpp`` adapter)."""

    def use_executable(self, executable: str) -> None:
        """Run ``executable`` as the engine."""
        ...


class Credential(msgspec.Struct, frozen=True):
    """A host-scoped node credential and the host id it is bound to."""

    token: str
    host_id: str | None = None


def load_credential(config: NodeConfig) -> Credential | None:
    """The credential from ``--token-file`` (JSON from ``token write`` or a bare token) or env."""
    raw = config.read_token()
    if raw is None:
        return None
    if raw.startswith("{"):
        try:
            doc = json.loads(raw)
            return Credential(token=str(doc["token"]), host_id=doc.get("host_id"))
        except (ValueError, KeyError) as exc:
            msg = f"--token-file {config.token_file}: not a node credential ({exc})"
            raise AuthError(msg) from None
    return Credential(token=raw)


def previous_instance(state_dir: Path, instance: str) -> str | None:
    """The instance id the agent file of ``state_dir`` names, when it is another run's.

    Read while holding the state directory's lock, so that run has ended. ``None`` when
    there is no readable file or it names no other run.
    """
    try:
        doc = json.loads((state_dir / AGENT_FILE).read_text())
    except (OSError, ValueError):
        return None
    prev = doc.get("instance") if isinstance(doc, dict) else None
    if not isinstance(prev, str) or prev == instance or not re.fullmatch(IDENT_PATTERN, prev):
        return None  # none, this run's own, or not an id the wire accepts
    return prev


def offered_adapters(installed: dict[str, A], wanted: tuple[str, ...]) -> dict[str, A]:
    """The runtime adapters this node offers: ``wanted`` (the configuration's ``runtimes``)
    out of the installed runtime plugins, or all of them when ``wanted`` is empty.

    Raises:
        ValidationError: a wanted runtime has no installed plugin (names it and what is).
    """
    if not wanted:
        return dict(installed)
    missing = sorted(set(wanted) - set(installed))
    if missing:
        msg = (
            f"runtimes (--runtime) {', '.join(missing)}: no such runtime plugin on this node "
            f"(installed: {', '.join(sorted(installed))}); see 'grid plugins'"
        )
        raise ValidationError(msg)
    return {name: installed[name] for name in wanted}


@dataclass
class ServerSession:
    """The agent's standing with one Grid server (several on a replicated store).

    Attributes:
        url: the server's base URL.
        client: the HTTP client for it (node credential attached once known).
        registered: the control record is registered there.
        routes: model id → engine record id registered there.
        follower: its last heartbeat answer said it follows another server.
        last_error: its last failure ("" when the last exchange succeeded).
    """

    url: str
    client: AsyncGridClient
    registered: bool = False
    routes: dict[str, str] = field(default_factory=dict)
    follower: bool = False
    last_error: str = ""


class NodeAgent:
    """One node agent bound to a state directory.

    With several Grid servers (``grid_url`` plus ``peer_urls``, servers sharing one etcd
    store), the agent registers its control record and engines with every one, so each can
    route, and executes commands from whichever one leads; receipts count as delivered only
    once the leader answered (a follower ignores them).

    Args:
        config: node configuration.
        plugins: plugin facade providing runtime adapters (and GPU devices).
        instance: unique id of this daemon instance (for the readiness lease).
    """

    def __init__(self, config: NodeConfig, plugins: Plugins, instance: str = "") -> None:
        self.config = config
        self.plugins = plugins
        self.instance = instance
        self.store = StateFile(config.state_dir)
        self.policy = ProtectionPolicy(
            dedicated=config.dedicated,
            unknown=config.unknown_sensor_policy,
            throttle_fraction=(
                DEFAULT_THROTTLE_FRACTION
                if config.throttle_fraction is None
                else config.throttle_fraction
            ),
        )
        self.decision: ProtectionDecision | None = None
        self.actuator: Actuator | None = None
        self.offer = RuntimeOffer({}, lambda _line: None)
        self.credential: Credential | None = None
        self.sessions: list[ServerSession] = []
        self.last_error = ""
        self.last_ok_at: float | None = None
        self._queue: asyncio.Queue[tuple[Command, float]] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._send = asyncio.Lock()
        self._queued: set[str] = set()
        self._cpu = telemetry.CpuMeter()
        self.fronts: EngineFronts | None = None
        self.refused = ""
        """Why a server refused this run for its host id (another agent holds it, or a newer
        one superseded this one); non-empty stops the agent (see :meth:`run`)."""
        self.predecessor: str | None = None
        """The previous run on this state directory (from its agent file, read under the
        lock, which proves that run has ended); sent with control registrations so the
        server hands the host id over at once after a crash."""
        self.ever_registered = False
        """Whether any server ever accepted this run's registration (a run refused at its
        start leaves children adopted from its state directory untouched)."""

    # --- lifecycle ------------------------------------------------------------------------
    @property
    def state(self) -> NodeState:
        assert self.actuator is not None
        return self.actuator.state

    async def open(self) -> None:
        """Lock the state directory, load state, adopt or fence surviving children."""
        self.store.lock()
        self.predecessor = previous_instance(self.config.state_dir, self.instance)
        self.credential = load_credential(self.config)
        host_id = self.config.host_id or (self.credential.host_id if self.credential else None)
        state = self.store.load_or_create(host_id)
        adapters = offered_adapters(self.plugins.runtime_adapters(), self.config.runtimes)
        llama = adapters.get("llama.cpp")
        if isinstance(llama, NamedExecutable) and self.config.llama_server:
            llama.use_executable(self.config.llama_server)
        self.actuator = Actuator(
            config=self.config,
            store=self.store,
            state=state,
            adapters=adapters,
            on_route_change=self.fence,
        )
        self.offer = RuntimeOffer(adapters, self.actuator.note)
        if self.config.engine_tls_enabled:
            assert self.config.engine_tls_cert is not None and self.config.engine_tls_key
            assert self.config.advertise_host is not None
            tls = load_engine_tls(
                self.config.advertise_host,
                self.config.engine_tls_cert,
                self.config.engine_tls_key,
                self.config.engine_ca,
            )
            actuator = self.actuator
            self.fronts = EngineFronts(
                tls=tls,
                key=state.engine_api_key,
                port_range=self.config.port_range,
                used_ports=lambda: {c.port for c in actuator.state.children.values()},
            )
            actuator.reserved_ports = self.fronts.ports
            actuator.advertise = self._advertised_url
        self.sessions = [
            ServerSession(
                url=url,
                client=AsyncGridClient(
                    url,
                    node_token=self.credential.token if self.credential else None,
                    timeout=HTTP_TIMEOUT_S,
                    ca_file=self.config.grid_ca,
                ),
            )
            for url in (self.config.grid_url, *self.config.peer_urls)
        ]
        await self.actuator.recover()
        self._write_agent_file(ready=False)

    async def close(self) -> None:
        """Stop the TLS fronts, release the HTTP client and the state lock."""
        if self.fronts is not None:
            await self.fronts.aclose()
        for session in self.sessions:
            await session.client.aclose()
        self.store.unlock()

    async def run(self, stop: asyncio.Event) -> None:
        """Heartbeat loop plus command worker until ``stop`` is set, then a graceful stop."""
        worker = asyncio.create_task(self._worker())
        try:
            while not stop.is_set():
                await self.beat()
                if self.refused:
                    self._write_agent_file(ready=False)
                    return
                self._write_agent_file(ready=True)
                self._wake.clear()
                waiters = [asyncio.create_task(self._wake.wait()), asyncio.create_task(stop.wait())]
                await asyncio.wait(
                    waiters,
                    timeout=self.config.heartbeat_interval_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for w in waiters:
                    w.cancel()
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    async def shutdown(self, idle_wait_s: float = UNLOAD_IDLE_WAIT_S) -> list[str]:
        """Graceful stop: fence every route, wait for requests, stop proven children, deregister.

        A run the servers refused (:attr:`refused`) only stops its children: every further
        report of it would be refused again, and its records are no longer its own to withdraw.
        """
        assert self.actuator is not None
        for child in self.state.children.values():
            if child.state == "ready":
                child.state = "draining"
        self.actuator.save()
        with contextlib.suppress(GridError):
            await self.fence()
        lines = await self.actuator.stop_all(idle_wait_s)
        for session in self.sessions if not self.refused else ():
            with contextlib.suppress(GridError):
                await self._sync_routes(session)
                if session.registered and self.credential is not None:
                    await self._call(session, Calls.remove(self.node_id, self._instance_id))
        return lines

    @property
    def _client(self) -> AsyncGridClient | None:
        """The first server's client (the one ``grid_url`` names)."""
        return self.sessions[0].client if self.sessions else None

    @property
    def registered(self) -> bool:
        """Registered with at least one server."""
        return any(s.registered for s in self.sessions)

    @property
    def routes(self) -> dict[str, str]:
        """Engine routes registered with the first server that has any."""
        for session in self.sessions:
            if session.routes:
                return session.routes
        return {}

    @property
    def node_id(self) -> str:
        return control_record_id(self.state.host_id)

    @property
    def _instance_id(self) -> str | None:
        """This run's id as sent to servers (``None`` for an agent built without one)."""
        return self.instance or None

    # --- one heartbeat ---------------------------------------------------------------------
    def protect(self) -> ProtectionDecision:
        """Take a sample and advance the protection state machine (persisting changes)."""
        gpus = self.plugins.gpu_devices()
        pids = [c.pid for c in self.state.children.values()]
        sample = telemetry.sample(gpus=gpus, cpu=self._cpu, managed_pids=pids)
        override = read_override(self.config.state_dir)
        probes = self.actuator.probes.values() if self.actuator else ()
        actives = [getattr(p, "active_requests", None) for p in probes]
        active = None if any(a is None for a in actives) else sum(a or 0 for a in actives)
        new, decision = step(
            self.state.protection,
            sample,
            self.policy,
            override=override,
            wall_now=time.time(),
            active_requests=active,
        )
        if new != self.state.protection or override != self.state.override:
            self.state.protection, self.state.override = new, override
            assert self.actuator is not None
            self.actuator.save()
        previous = self.decision
        self.decision = decision
        if previous is not None and previous.admits_new_work and not decision.admits_new_work:
            self._wake.set()  # a fence heartbeat goes out promptly
        return decision

    async def beat(self) -> None:
        """One cycle: protect, probe, routes, control heartbeat (commands queued)."""
        assert self.actuator is not None
        previous = self.decision
        decision = self.protect()
        await self.actuator.refresh()
        await self.offer.refresh(time.monotonic())
        fenced = previous is not None and previous.admits_new_work and not decision.admits_new_work
        errors = []
        for session in self.sessions:
            try:
                await self._beat_one(session, fenced=fenced)
                session.last_error = ""
            except GridError as exc:
                session.last_error = f"{type(exc).__name__}: {exc}"[:500]
                errors.append(session.last_error)
                if isinstance(exc, RequestRefused) and exc.status == 404:
                    session.registered = False
                if isinstance(exc, ConflictError):
                    # Another run speaks for this host id: acting on would run engines the
                    # controller counts as the other run's host. Stop (see run()).
                    self.refused = str(exc)
                    self.last_error = self.refused[:500]
                    return
        if len(errors) < len(self.sessions):
            self.last_ok_at = time.time()
        # One server answering is enough: the others' failures stay visible per session.
        self.last_error = errors[0] if len(errors) == len(self.sessions) else ""

    async def _beat_one(self, session: ServerSession, *, fenced: bool) -> None:
        """Register (once), sync routes and heartbeat with one server."""
        await self._ensure_credential()
        if not session.registered:
            await self._register(session)
            await self._heartbeat(session, request_commands=False)  # early lease
        await self._sync_routes(session)
        if fenced:
            await self._heartbeat(session, request_commands=False)
        await self._heartbeat(session, request_commands=True)

    async def fence(self) -> None:
        """Withdraw routes of children no longer ready and tell the server now (no commands);
        nothing is sent once the servers refused this run (see :meth:`shutdown`)."""
        for session in self.sessions if not self.refused else ():
            if not session.registered:
                continue
            try:
                await self._sync_routes(session)
                await self._heartbeat(session, request_commands=False)
            except GridError as exc:
                session.last_error = f"{type(exc).__name__}: {exc}"[:500]
                if session is self.sessions[0] and len(self.sessions) == 1:
                    raise

    # --- HTTP ------------------------------------------------------------------------------
    async def _ensure_credential(self) -> None:
        if self.credential is not None:
            return
        # A node on the machine that owns the Grid may mint its own host-scoped credential
        # with the local operator capability; it stays in memory only.
        token_path = grid_home() / "operator-token"
        try:
            operator = token_path.read_text().strip()
        except OSError:
            msg = (
                "no node credential: pass --token-file (from 'grid allocator token write'), "
                "set GRID_ALLOCATOR_NODE_TOKEN, or run on the Grid's own machine"
            )
            raise AuthError(msg) from None
        first = self.sessions[0].client
        minted = AsyncGridClient(first.url, operator_token=operator, http=first.http)
        issued = await minted.send(Calls.issue_node_credential(self.state.host_id))
        self.credential = Credential(token=issued.token, host_id=self.state.host_id)
        for session in self.sessions:  # servers of one grid share the credential signing key
            session.client.node_token = issued.token

    async def _call(self, session: ServerSession, call: Call[T]) -> T:
        """Send one node-credential call; a refused credential becomes an :class:`AuthError`.

        Raises:
            AuthError: the server answered 401/403 (the message quotes its reason).
            RequestRefused: any other error status.
            ServerUnreachable: no answer (retried at the next heartbeat).
        """
        assert self.credential is not None
        try:
            return await session.client.send(call)
        except RequestRefused as exc:
            if exc.status in (401, 403):
                msg = f"{call.method} {call.path}: the server refused the node credential "
                raise AuthError(msg + f"({exc.message[:200]})") from None
            if exc.status == 409:
                msg = f"{session.url} refused this node agent: {exc.message[:600]}"
                raise ConflictError(msg) from None
            raise

    def _envelope(self) -> AllocatorEnvelope:
        assert self.actuator is not None and self.decision is not None
        return AllocatorEnvelope(
            state=self.decision.state,
            state_reason=self.decision.reason[:1900],
            cached_models=sorted(self.state.artifacts),
            cached_artifacts=self.actuator.cached_artifacts(),
            residencies=self.actuator.residencies(),
            actuator_capabilities=CAPABILITIES,
            highest_term=self.state.highest_term,
            latest_generation=self.state.latest_generation,
        )

    def _resources(self) -> Resources:
        assert self.decision is not None
        assert self.actuator is not None
        return telemetry.resources(
            capacity_share=self.config.capacity_share,
            managed_pids=[c.pid for c in self.state.children.values()],
            artifact_dir=self.config.artifact_dir,
            runtimes=self.offer.offered,
            throttle_fraction=self.decision.throttle_fraction,
            failure_domain=self.config.failure_domain,
            tags=self.config.tags,
            gpus=self.plugins.gpu_devices(),
        )

    async def _register(self, session: ServerSession) -> None:
        reg = NodeRegistration(
            role="allocator",
            host_id=self.state.host_id,
            resources=self._resources(),
            allocator=self._envelope(),
            advertise_host=self.config.advertise_host,
            instance_id=self._instance_id,
            replaces_instance_id=self.predecessor if self._instance_id else None,
        )
        async with self._send:
            await self._call(session, Calls.register(self.node_id, reg))
        session.registered = True
        self.ever_registered = True

    async def _heartbeat(self, session: ServerSession, *, request_commands: bool) -> None:
        pending = [r for r in self.state.receipts if not r.delivered]
        assert self.actuator is not None
        active = sum(p.active_requests or 0 for p in self.actuator.probes.values())
        hb = Heartbeat(
            node_id=self.node_id,
            host_id=self.state.host_id,
            load=Load(active_tasks=active, queue_depth=self._queue.qsize()),
            resources=self._resources(),
            allocator=self._envelope(),
            request_commands=request_commands,
            acknowledgements=[r.ack for r in pending[:MAX_LIST]],
            instance_id=self._instance_id,
        )
        async with self._send:
            sent = time.monotonic()
            resp = await self._call(session, Calls.heartbeat(self.node_id, hb))
        session.follower = resp.allocator is not None and resp.allocator.follower
        if not session.follower:
            # Only the leader takes receipts: a follower's answer leaves them for the leader.
            for receipt in pending[:MAX_LIST]:
                receipt.delivered = True
        if resp.model_last_used_at:
            for model, at in resp.model_last_used_at.items():
                # The watermark only moves forward (a restarted server may report older).
                if at > self.state.model_last_used_at.get(model, 0.0):
                    self.state.model_last_used_at[model] = at
        assert self.actuator is not None
        self.actuator.save()
        if request_commands and resp.allocator is not None:
            deadline = sent + resp.allocator.controller_lease_ttl_seconds
            for cmd in resp.allocator.commands:
                if cmd.action_id not in self._queued:
                    self._queued.add(cmd.action_id)
                    self._queue.put_nowait((cmd, deadline))

    async def _sync_routes(self, session: ServerSession) -> None:
        """Register ready children as engine records with one server, refresh them,
        withdraw the rest."""
        assert self.actuator is not None
        ready = {m: c for m, c in self.state.children.items() if c.state == "ready"}
        if self.fronts is not None:
            # A draining child keeps its front until it is gone: requests in flight finish.
            live = ("ready", "draining")
            await self.fronts.retain(
                {m: c.url for m, c in self.state.children.items() if c.state in live}
            )
        for model_id in list(session.routes):
            if model_id not in ready:
                rid = session.routes[model_id]
                async with self._send:
                    with contextlib.suppress(RequestRefused):  # already gone: fine
                        await self._call(session, Calls.remove(rid, self._instance_id))
                # Forgotten only after the server answered; a transport error retries next beat.
                session.routes.pop(model_id, None)
        for model_id, child in ready.items():
            probe = self.actuator.probes.get(model_id)
            if probe is not None and not getattr(probe, "ready", False):
                continue  # advertise only children passing the health check
            rid = engine_record_id(self.state.host_id, model_id)
            if model_id in session.routes:
                hb = Heartbeat(
                    node_id=rid,
                    host_id=self.state.host_id,
                    request_commands=False,
                    instance_id=self._instance_id,
                )
                try:
                    async with self._send:
                        await self._call(session, Calls.heartbeat(rid, hb))
                    continue
                except RequestRefused:
                    session.routes.pop(model_id, None)
            url, ca_pem = child.url, None
            if self.fronts is not None:
                url = await self.fronts.ensure(model_id, child.url)
                ca_pem = self.fronts.tls.ca_pem
            reg = NodeRegistration(
                role="engine",
                host_id=self.state.host_id,
                models=[model_id],
                url=url,
                engine_api_key=self.state.engine_api_key,
                engine_ca_pem=ca_pem,
                instance_id=self._instance_id,
            )
            async with self._send:
                await self._call(session, Calls.register(rid, reg))
            session.routes[model_id] = rid

    def _advertised_url(self, child: ChildRecord) -> str | None:
        """The URL the server reaches ``child`` at: its TLS front's, once that runs."""
        if self.fronts is None:
            return child.url
        return self.fronts.url_for(child.model_id, child.url)

    # --- worker ----------------------------------------------------------------------------
    async def _worker(self) -> None:
        assert self.actuator is not None
        while True:
            cmd, deadline = await self._queue.get()
            decision = self.decision or self.protect()
            try:
                await self.actuator.execute(cmd, deadline_mono=deadline, decision=decision)
            except (GridError, httpx.HTTPError) as exc:  # adapters talk to engines with httpx
                self.last_error = f"{cmd.kind} {cmd.model_id}: {exc}"[:500]
            finally:
                self._queued.discard(cmd.action_id)
            self._wake.set()

    # --- status file -----------------------------------------------------------------------
    def mark_stopped(self) -> None:
        """Record a clean stop in the agent file (status then shows no stale state)."""
        for session in self.sessions:
            session.registered = False
        self.decision = None
        self._write_agent_file(ready=False)

    def _write_agent_file(self, *, ready: bool) -> None:
        now = time.time()
        doc = {
            "instance": self.instance,
            "pid": os.getpid(),
            "birth": birth_of(os.getpid()),
            "host_id": self.state.host_id,
            "grid_url": self.config.grid_url,
            "ready": ready,
            "ready_until": now + READY_LEASE_BEATS * self.config.heartbeat_interval_s
            if ready
            else None,
            "registered": self.registered,
            "last_ok_at": self.last_ok_at,
            "last_error": self.last_error,
            "written_at": now,
            "state": self.decision.state if self.decision else "stopped",
            "reason": self.decision.reason if self.decision else "",
            "routes": sorted(self.routes),
            "servers": [
                {
                    "url": x.url,
                    "registered": x.registered,
                    "follower": x.follower,
                    "last_error": x.last_error,
                }
                for x in self.sessions
            ],
            "events": self.actuator.events[-10:] if self.actuator else [],
        }
        with contextlib.suppress(StateError):
            write_atomic(self.config.state_dir / AGENT_FILE, json.dumps(doc))
