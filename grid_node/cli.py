"""``grid allocator node start|status|stop|drain|pause|quarantine|resume``.

Every command takes ``--state-dir`` (env ``GRID_NODE_STATE_DIR``), so several agents can run
on one machine side by side, each with its own state, credential, port range and share.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated

import typer

from grid_core.cliregistry import CliRegistry
from grid_core.errors import ConflictError, NotFoundError, UnavailableError, ValidationError
from grid_core.protection import Override, OverrideKind
from grid_core.system import (
    ProcessIdentity,
    Proof,
    exit_status,
    grid_home,
    spawn_detached,
    stop_process_sync,
    wait_until_sync,
)
from grid_node.agent import AGENT_FILE, read_override, write_override
from grid_node.config import DEFAULT_GRID_URL, check_grid_url, parse_port_range

START_WAIT_S = 60.0
"""Seconds ``node start`` waits for the new instance to register before reporting failure."""
STOP_WAIT_S = 180.0
"""Seconds ``node stop`` waits for the daemon to drain and exit (covers the unload idle wait)."""
POLL_S = 0.2
"""Seconds between checks of the agent record while starting or stopping."""

StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        envvar="GRID_NODE_STATE_DIR",
        help="Node state directory (default $GRID_HOME/node).",
    ),
]


def _state_dir(value: Path | None) -> Path:
    return (value or grid_home() / "node").expanduser().resolve()


def _grid_url(grid: str | None) -> str:
    if grid and grid.startswith(("http://", "https://")):
        return grid.rstrip("/")
    try:
        rec = json.loads((grid_home() / "server.json").read_text())
        return str(rec["url"]).rstrip("/")
    except (OSError, ValueError, KeyError):
        return DEFAULT_GRID_URL


def _agent_record(state_dir: Path) -> dict | None:
    try:
        return json.loads((state_dir / AGENT_FILE).read_text())
    except (OSError, ValueError):
        return None


def _daemon_identity(rec: dict) -> ProcessIdentity:
    return ProcessIdentity(
        int(rec["pid"]), rec.get("birth"), args=(("--instance", str(rec["instance"])),)
    )


def _daemon_proof(rec: dict) -> Proof:
    return _daemon_identity(rec).prove()


def _tail(path: Path, n: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def start(
    grid: Annotated[str | None, typer.Option("--grid", help="Grid URL or 'local'.")] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file", help="Node credential file from 'grid allocator token write'."
        ),
    ] = None,
    dedicated: Annotated[
        bool,
        typer.Option("--dedicated", help="Always-on server: ignore battery and user activity."),
    ] = False,
    state_dir: StateDir = None,
    host_id: Annotated[
        str | None,
        typer.Option("--host-id", envvar="GRID_NODE_HOST_ID", help="Stable host id override."),
    ] = None,
    port_range: Annotated[
        str,
        typer.Option(
            "--port-range", envvar="GRID_NODE_PORT_RANGE", help="Managed engine ports LOW-HIGH."
        ),
    ] = "22200-22299",
    capacity_share: Annotated[
        float,
        typer.Option(
            "--capacity-share",
            envvar="GRID_NODE_CAPACITY_SHARE",
            help="Fraction of this machine's memory and disk this agent offers.",
        ),
    ] = 1.0,
    models_dir: Annotated[
        list[Path] | None,
        typer.Option("--models-dir", help="Directory of local GGUFs (repeatable)."),
    ] = None,
    llama_server: Annotated[
        str | None, typer.Option("--llama-server", help="Explicit llama-server path.")
    ] = None,
    failure_domain: Annotated[str | None, typer.Option("--failure-domain")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="Placement tag.")] = None,
    heartbeat_interval: Annotated[
        float, typer.Option("--heartbeat-interval", help="Seconds between heartbeats.")
    ] = 5.0,
    throttle_fraction: Annotated[
        float | None,
        typer.Option(
            "--throttle-fraction",
            min=0.0,
            max=1.0,
            help="Share of capacity offered while CPU-throttled (default 0.5).",
        ),
    ] = None,
    unknown_sensors: Annotated[
        str,
        typer.Option(
            "--unknown-sensors", help="Missing sensors: ignore, or throttle conservatively."
        ),
    ] = "ignore",
) -> None:
    """Start this machine's node agent in the background and wait until it has registered."""
    parse_port_range(port_range)
    if unknown_sensors not in ("ignore", "throttle"):
        raise ValidationError(f"--unknown-sensors {unknown_sensors!r}: use ignore or throttle")
    if not 0.01 <= capacity_share <= 1.0:
        raise ValidationError(f"--capacity-share {capacity_share}: use 0.01..1")
    sdir = _state_dir(state_dir)
    sdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    rec = _agent_record(sdir)
    if rec is not None and _daemon_proof(rec).status == "proven":
        msg = f"a node agent (pid {rec['pid']}) already runs for {sdir}; stop it first"
        raise ConflictError(msg)
    url = check_grid_url(_grid_url(grid))
    instance = uuid.uuid4().hex
    argv = [
        sys.executable,
        "-m",
        "grid_node.daemon",
        "--instance",
        instance,
        "--state-dir",
        str(sdir),
        "--grid",
        url,
        "--port-range",
        port_range,
        "--capacity-share",
        str(capacity_share),
        "--heartbeat-interval",
        str(heartbeat_interval),
        "--unknown-sensors",
        unknown_sensors,
    ]
    if token_file is not None:
        argv += ["--token-file", str(token_file.resolve())]
    for flag, value in (
        ("--host-id", host_id),
        ("--llama-server", llama_server),
        ("--failure-domain", failure_domain),
    ):
        if value:
            argv += [flag, value]
    if dedicated:
        argv.append("--dedicated")
    if throttle_fraction is not None:
        argv += ["--throttle-fraction", str(throttle_fraction)]
    for d in models_dir or ():
        argv += ["--models-dir", str(d.resolve())]
    for t in tag or ():
        argv += ["--tag", t]
    log = sdir / "agent.log"
    # The daemon inherits the whole environment on purpose: GRID_ALLOCATOR_NODE_TOKEN may be
    # how its credential arrives (never in argv).
    pid = spawn_detached(argv, log_path=log, env=dict(os.environ))

    def registered() -> dict | None:
        rec = _agent_record(sdir)
        if (
            rec
            and rec.get("instance") == instance
            and rec.get("ready")
            and rec.get("registered")
            and (rec.get("ready_until") or 0) > time.time()
        ):
            return rec
        if exit_status(pid) is not None:
            msg = f"node agent exited during start:\n{_tail(log)}"
            raise UnavailableError(msg)
        return None

    rec = wait_until_sync(registered, timeout_s=START_WAIT_S, interval_s=POLL_S)
    if rec is not None:
        typer.echo(
            f"node agent started: host {rec['host_id']} pid {pid} "
            f"grid {rec['grid_url']} state {sdir}"
        )
        return
    err = (_agent_record(sdir) or {}).get("last_error") or "no heartbeat yet"
    msg = (
        f"node agent pid {pid} is running but has not registered within "
        f"{START_WAIT_S:.0f} s ({err}); see {log}"
    )
    raise UnavailableError(msg)


def status(
    state_dir: StateDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Show this node: daemon, protection state, override, children and recent events."""
    from grid_core.table import render_table
    from grid_node.state import StateFile

    sdir = _state_dir(state_dir)
    rec = _agent_record(sdir) or {}
    proof = _daemon_proof(rec) if rec else None
    state = StateFile(sdir).load()
    if not rec and state is None:
        # Nothing was ever started here: a table of "None" fields would only mislead.
        msg = (
            f"no node agent in STATE_DIR {sdir}; start one with 'grid allocator node start' "
            "(or pass --state-dir)"
        )
        raise NotFoundError(msg)
    override = read_override(sdir)
    doc = {
        "state_dir": str(sdir),
        "daemon": {
            "pid": rec.get("pid"),
            "running": bool(proof and proof.status == "proven"),
            "proof": proof.reason if proof else "no agent record",
            "registered": rec.get("registered"),
            "last_error": rec.get("last_error"),
            "grid_url": rec.get("grid_url"),
        },
        "host_id": state.host_id if state else None,
        "protection": {"state": rec.get("state"), "reason": rec.get("reason")},
        "override": None
        if override is None
        else {"kind": override.kind, "reason": override.reason, "expires_at": override.expires_at},
        "children": [
            {
                "model_id": c.model_id,
                "state": c.state,
                "pid": c.pid,
                "port": c.port,
                "failure": c.failure,
            }
            for c in (state.children.values() if state else ())
        ],
        "highest_term": state.highest_term if state else 0,
        "latest_generation": state.latest_generation if state else None,
        "receipts": [
            {
                "action_id": r.ack.action_id,
                "kind": r.kind,
                "model_id": r.model_id,
                "status": r.ack.status,
                "message": r.ack.message,
            }
            for r in (state.receipts[-10:] if state else [])
        ],
        "events": rec.get("events", []),
    }
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    d = doc["daemon"]
    typer.echo(
        f"host {doc['host_id']}  daemon {'running' if d['running'] else 'stopped'}"
        f" (pid {d['pid']})  grid {d['grid_url']}  registered {d['registered']}"
    )
    typer.echo(f"protection: {doc['protection']['state']} — {doc['protection']['reason']}")
    if doc["override"]:
        o = doc["override"]
        typer.echo(f"override: {o['kind']} — {o['reason']} (expires {o['expires_at']})")
    if d["last_error"]:
        typer.echo(f"last error: {d['last_error']}")
    typer.echo(
        render_table(
            ["model", "state", "pid", "port", "failure"],
            [
                [c["model_id"], c["state"], c["pid"], c["port"], c["failure"] or "-"]
                for c in doc["children"]
            ],
        )
    )


def stop(
    state_dir: StateDir = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Without a daemon: stop children even if requests still run."),
    ] = False,
) -> None:
    """Drain gracefully and stop the agent and its identity-proven children."""
    sdir = _state_dir(state_dir)
    rec = _agent_record(sdir)
    if rec is not None:
        proof = _daemon_proof(rec)
        if proof.status == "proven":
            # No SIGKILL: a draining agent is waiting for requests; killing it would cut them.
            outcome = stop_process_sync(_daemon_identity(rec), grace_s=STOP_WAIT_S, escalate=False)
            if outcome == "running":
                msg = (
                    f"node agent pid {rec['pid']} is still draining after {STOP_WAIT_S:.0f} s; "
                    "run node stop again later"
                )
                raise UnavailableError(msg)
            typer.echo(f"node agent pid {rec['pid']} drained and stopped")
            tail = _tail(sdir / "agent.log", 5)
            if tail:
                typer.echo(f"last lines of {sdir / 'agent.log'}:")
                typer.echo("\n".join(f"  {line}" for line in tail.splitlines()))
            return
        if proof.status == "unproven":
            msg = (
                f"refusing to signal pid {rec['pid']}: {proof.reason}; inspect it by hand "
                "(it may be a reused pid or another program)"
            )
            raise ConflictError(msg)
    for line in asyncio.run(_stop_children(sdir, force)):
        typer.echo(line)


async def _stop_children(sdir: Path, force: bool) -> list[str]:
    """No daemon is running: adopt what is provable from the state and stop it."""
    from grid_core.plugins import get_plugins
    from grid_node.actuator import UNLOAD_IDLE_WAIT_S, Actuator
    from grid_node.config import NodeConfig
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


def _set_override(
    kind: OverrideKind, reason: str, for_seconds: float | None, state_dir: Path | None
) -> None:
    if not reason.strip():
        raise ValidationError("--reason must say why (it is shown in status)")
    if for_seconds is not None and for_seconds <= 0:
        raise ValidationError("--for-seconds must be positive")
    now = time.time()
    sdir = _state_dir(state_dir)
    override = Override(
        kind=kind,
        reason=reason.strip()[:500],
        set_at=now,
        expires_at=now + for_seconds if for_seconds else None,
    )
    write_override(sdir, override)
    until = f" for {for_seconds:.0f} s" if for_seconds else " until 'node resume'"
    typer.echo(f"local {kind} set{until}: {override.reason}")


Reason = Annotated[str, typer.Option("--reason", help="Why (shown in status).")]
ForSeconds = Annotated[
    float | None, typer.Option("--for-seconds", help="Lapse automatically after this many seconds.")
]


def drain(reason: Reason, for_seconds: ForSeconds = None, state_dir: StateDir = None) -> None:
    """Stop new work here and let running requests finish (durable local override)."""
    _set_override("drain", reason, for_seconds, state_dir)


def pause(reason: Reason, for_seconds: ForSeconds = None, state_dir: StateDir = None) -> None:
    """Reclaim this machine: no new work (durable local override)."""
    _set_override("pause", reason, for_seconds, state_dir)


def quarantine(reason: Reason, for_seconds: ForSeconds = None, state_dir: StateDir = None) -> None:
    """Fence this machine until explicitly resumed (durable local override)."""
    _set_override("quarantine", reason, for_seconds, state_dir)


def resume(state_dir: StateDir = None) -> None:
    """Clear the local override (sensors may still keep the host throttled or paused)."""
    sdir = _state_dir(state_dir)
    previous = read_override(sdir)
    write_override(sdir, None)
    typer.echo("local override cleared" if previous else "no local override was set")


def register(cli: CliRegistry) -> None:
    """Mount the node commands on ``grid allocator node``."""
    node = cli.subgroup("allocator", "node", help="This machine's managed node agent.")
    for fn in (start, status, stop, drain, pause, quarantine, resume):
        node.command(name=fn.__name__)(fn)
