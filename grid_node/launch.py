"""Start, stop and inspect a node agent daemon: the API behind ``grid allocator node``.

The CLI goes through these functions, and every other tool through
:class:`NodeAgentLauncher`, the node package's answer to the ``grid_node_launcher`` hook
(:class:`~grid_core.nodelaunch.NodeLauncher`). Both hand over a
:class:`~grid_core.nodeconfig.NodeConfig`, which is written to the state directory as the one
configuration document the daemon reads (``python -m grid_node.daemon --config FILE``). What
the running daemon reports about itself is read back as a typed :class:`AgentRecord`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import msgspec

from grid_core.errors import AuthError, ConflictError, UnavailableError
from grid_core.nodeconfig import NodeConfig, load_config
from grid_core.nodelaunch import NodeProcesses
from grid_core.system import (
    SAFE_PATH_FLAG,
    ProcessIdentity,
    Proof,
    exit_status,
    spawn_detached,
    stop_process_sync,
    wait_until_sync,
)

AGENT_FILE = "agent.json"
"""The daemon's own record in its state directory (pid, birth, instance, readiness)."""
STATE_FILE = "node.json"
LOG_FILE = "agent.log"
START_WAIT_S = 60.0
"""Seconds a start waits for the new instance to register before reporting failure."""
STOP_WAIT_S = 180.0
"""Seconds a stop waits for the daemon to drain and exit (covers the unload idle wait)."""
POLL_S = 0.2
"""Seconds between checks of the agent record while starting or stopping."""
LOG_TAIL_LINES = 8
"""Log lines quoted when a daemon exits during its start."""


class AgentRecord(msgspec.Struct, kw_only=True):
    """What a running (or stopped) daemon says about itself in ``agent.json``.

    Attributes:
        instance: unique id of the daemon instance (also in its argv, for identity proofs).
        pid: the daemon's process id; birth: its start time (seconds since the epoch).
        host_id / grid_url: who it is and which server it talks to.
        ready / ready_until: readiness lease (Unix seconds); registered: the server knows it.
        last_ok_at / last_error: the last successful heartbeat and the last failure.
        state / reason: protection state and why.
        routes: models it advertises; events: its recent lifecycle events.
    """

    instance: str = ""
    pid: int | None = None
    birth: float | None = None
    host_id: str | None = None
    grid_url: str | None = None
    ready: bool = False
    ready_until: float | None = None
    registered: bool = False
    last_ok_at: float | None = None
    last_error: str = ""
    written_at: float | None = None
    state: str = "stopped"
    reason: str = ""
    routes: list[str] = []
    events: list[str] = []

    def identity(self) -> ProcessIdentity | None:
        """The daemon's provable identity (pid + birth + ``--instance`` in argv)."""
        if self.pid is None:
            return None
        return ProcessIdentity(self.pid, self.birth, args=(("--instance", self.instance),))

    def proof(self) -> Proof | None:
        """Whether the recorded pid is still this daemon (``None`` without a pid)."""
        ident = self.identity()
        return None if ident is None else ident.prove()


def agent_record(state_dir: Path) -> AgentRecord | None:
    """The daemon's record in ``state_dir``, or None when absent or unreadable."""
    try:
        return msgspec.json.decode((state_dir / AGENT_FILE).read_bytes(), type=AgentRecord)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def agent_running(state_dir: Path) -> bool:
    """True when the recorded daemon is alive and provably itself."""
    rec = agent_record(state_dir)
    proof = rec.proof() if rec else None
    return proof is not None and proof.status == "proven"


def engine_processes(state_dir: Path) -> list[tuple[int, float | None]]:
    """``(pid, birth)`` of every engine child recorded in the node's durable state."""
    from grid_node.state import StateFile

    try:
        state = StateFile(state_dir).load()
    except Exception:  # a damaged state file records nothing we could prove
        return []
    return [(c.pid, c.birth) for c in (state.children.values() if state else ())]


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    """The last ``n`` lines of a log file ("" when missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def start_node(
    config: NodeConfig,
    *,
    env: Mapping[str, str] | None = None,
    wait_s: float = START_WAIT_S,
) -> AgentRecord:
    """Write ``config`` as the node's document, start the daemon, wait until it registers.

    Args:
        config: the node configuration (written to ``config.path``, 0600).
        env: the daemon's environment (default: ours, so ``$GRID_ALLOCATOR_NODE_TOKEN`` can
            carry the credential; it never travels in argv or in the document).
        wait_s: seconds to wait for the first successful registration.

    Returns:
        The daemon's record once it is registered and ready.

    Raises:
        ConflictError: a daemon already runs for this state directory.
        ValidationError: the engine TLS certificate, key or CA is unusable (the flag is named),
            or a configured runtime has no installed plugin.
        UnavailableError: the daemon exited during its start, or did not register in time
            (the message quotes its log and last error).
    """
    sdir = config.state_dir
    _check_startable(config)
    path = config.save()
    instance = uuid.uuid4().hex
    argv = [
        sys.executable,
        SAFE_PATH_FLAG,
        "-m",
        "grid_node.daemon",
        "--instance",
        instance,
        "--config",
        str(path),
    ]
    log = sdir / LOG_FILE
    # The daemon inherits the environment on purpose: GRID_ALLOCATOR_NODE_TOKEN may be how its
    # credential arrives (never in argv or in the document).
    pid = spawn_detached(argv, log_path=log, env=dict(os.environ if env is None else env))
    return _wait_registered(sdir, instance, pid, log, wait_s)


def _check_startable(config: NodeConfig) -> None:
    """Create the state directory and refuse, each in one line rather than in the daemon's
    log, a start that cannot succeed.

    Raises:
        ConflictError: a daemon already runs for this state directory.
        ValidationError: the engine TLS files are unusable, or a configured runtime has no
            installed plugin.
    """
    sdir = config.state_dir
    sdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    rec = agent_record(sdir)
    proof = rec.proof() if rec else None
    if rec is not None and proof is not None and proof.status == "proven":
        msg = f"a node agent (pid {rec.pid}) already runs for {sdir}; stop it first"
        raise ConflictError(msg)
    if config.engine_tls_enabled:
        from grid_node.engine_tls import load_engine_tls  # brings the HTTP and X.509 stacks

        assert config.advertise_host and config.engine_tls_cert and config.engine_tls_key
        load_engine_tls(
            config.advertise_host,
            config.engine_tls_cert,
            config.engine_tls_key,
            config.engine_ca,
        )
    if config.runtimes:
        from grid_core.plugins import get_plugins
        from grid_node.agent import offered_adapters

        offered_adapters(get_plugins().runtime_adapters(), config.runtimes)


def _wait_registered(sdir: Path, instance: str, pid: int, log: Path, wait_s: float) -> AgentRecord:
    """The record of daemon ``instance`` (PID ``pid``) once it is registered and ready.

    Raises:
        UnavailableError: the daemon exited meanwhile, the server refused its credential
            (revoked, expired or not this grid's: waiting will not change that, so this is
            said at once; the daemon is left running, as on a timeout), or it did not
            register within ``wait_s`` seconds (the message quotes its log, or its last
            error).
    """

    def registered() -> AgentRecord | None:
        now = agent_record(sdir)
        if (
            now is not None
            and now.instance == instance
            and now.ready
            and now.registered
            and (now.ready_until or 0) > time.time()
        ):
            return now
        if now is not None and now.instance == instance and _credential_refused(now):
            msg = (
                f"node agent pid {pid} is running but the server refused its credential "
                f"({now.last_error}); see {log}"
            )
            raise UnavailableError(msg)
        if exit_status(pid) is not None:
            msg = f"node agent exited during start:\n{log_tail(log)}"
            raise UnavailableError(msg)
        return None

    done = wait_until_sync(registered, timeout_s=wait_s, interval_s=POLL_S)
    if done is not None:
        return done
    err = (agent_record(sdir) or AgentRecord()).last_error or "no heartbeat yet"
    msg = (
        f"node agent pid {pid} is running but has not registered within {wait_s:.0f} s "
        f"({err}); see {log}"
    )
    raise UnavailableError(msg)


def _credential_refused(rec: AgentRecord) -> bool:
    """Whether every server refused the daemon's node credential: its last error is an
    :class:`~grid_core.errors.AuthError`, which the agent records as ``AuthError: …``
    (:meth:`grid_node.agent.NodeAgent.beat` writes ``TYPE: message``)."""
    return rec.last_error.startswith(f"{AuthError.__name__}:")


def stop_node(state_dir: Path, *, force: bool = False, wait_s: float = STOP_WAIT_S) -> list[str]:
    """Drain and stop the daemon of ``state_dir`` (or, without one, its proven children).

    Returns:
        One line per thing stopped, for the operator.

    Raises:
        ConflictError: the recorded pid is alive but not provably the daemon.
        UnavailableError: the daemon is still draining after ``wait_s`` seconds.
    """
    rec = agent_record(state_dir)
    ident = rec.identity() if rec else None
    if rec is not None and ident is not None:
        proof = ident.prove()
        if proof.status == "proven":
            # No SIGKILL: a draining agent is waiting for requests; killing it would cut them.
            outcome = stop_process_sync(ident, grace_s=wait_s, escalate=False)
            if outcome == "running":
                msg = (
                    f"node agent pid {rec.pid} is still draining after {wait_s:.0f} s; "
                    "run node stop again later"
                )
                raise UnavailableError(msg)
            lines = [f"node agent pid {rec.pid} drained and stopped"]
            tail = log_tail(state_dir / LOG_FILE, 5)
            if tail:
                lines.append(f"last lines of {state_dir / LOG_FILE}:")
                lines.extend(f"  {line}" for line in tail.splitlines())
            return lines
        if proof.status == "unproven":
            msg = (
                f"refusing to signal pid {rec.pid}: {proof.reason}; inspect it by hand "
                "(it may be a reused pid or another program)"
            )
            raise ConflictError(msg)
    return asyncio.run(_stop_children(state_dir, force))


async def _stop_children(sdir: Path, force: bool) -> list[str]:
    """No daemon is running: adopt what is provable from the state and stop it."""
    from grid_core.plugins import get_plugins
    from grid_node.actuator import UNLOAD_IDLE_WAIT_S, Actuator
    from grid_node.state import StateFile

    store = StateFile(sdir)
    state = store.load()
    if state is None:
        return [f"no node state in {sdir}; nothing to stop"]
    store.lock()
    try:
        act = Actuator(
            config=NodeConfig(state_dir=sdir),
            store=store,
            state=state,
            adapters=get_plugins().runtime_adapters(),
        )
        await act.recover()
        lines = await act.stop_all(UNLOAD_IDLE_WAIT_S, force=force)
    finally:
        store.unlock()
    return lines or ["no children to stop"]


class NodeAgentLauncher:
    """The node package's :class:`~grid_core.nodelaunch.NodeLauncher`.

    Registered through the ``grid_node_launcher`` hook (:mod:`grid_node.plugin`); tools that
    may import only the public plugin API (the logical fleet) start and stop agents with it.
    """

    def start(self, config_file: Path, *, env: Mapping[str, str] | None = None) -> NodeProcesses:
        """Read and validate the document at ``config_file``, then :func:`start_node` it.

        Raises:
            ValidationError: the document is invalid (the field is named).
            ConflictError / UnavailableError: as :func:`start_node`.
        """
        config = load_config(config_file)
        rec = start_node(config, env=env)
        return NodeProcesses(
            agent_pid=rec.pid,
            agent_birth=rec.birth,
            agent_running=True,
            engines=tuple(engine_processes(config.state_dir)),
        )

    def stop(self, state_dir: Path, *, force: bool = False) -> list[str]:
        """:func:`stop_node` of ``state_dir``."""
        return stop_node(state_dir, force=force)

    def processes(self, state_dir: Path) -> NodeProcesses:
        """The recorded daemon (proven or not) and its recorded engine children."""
        rec = agent_record(state_dir)
        proof = rec.proof() if rec else None
        return NodeProcesses(
            agent_pid=rec.pid if rec else None,
            agent_birth=rec.birth if rec else None,
            agent_running=proof is not None and proof.status == "proven",
            engines=tuple(engine_processes(state_dir)),
        )
