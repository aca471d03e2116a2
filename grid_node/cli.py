"""``grid allocator node start|status|stop|drain|pause|quarantine|resume|rotate-engine-key``.

Every command takes ``--state-dir`` (env ``GRID_NODE_STATE_DIR``), so several agents can run
on one machine side by side, each with its own state, credential, port range and share.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from grid_core.client import Calls, GridClient, ServerUnreachable
from grid_core.clioptions import GridOption
from grid_core.cliregistry import CliRegistry
from grid_core.errors import ConflictError, NotFoundError, ValidationError
from grid_core.grids import GridTarget, resolve_target
from grid_core.nodeconfig import CONFIG_FILE, NodeConfig, load_config, parse_port_range
from grid_core.protection import Override, OverrideKind
from grid_core.system import grid_home
from grid_node.join import join, read_join_file
from grid_node.launch import (
    AGENT_FILE,
    STATE_FILE,
    agent_record,
    agent_running,
    start_node,
    stop_node,
)
from grid_node.override import OVERRIDE_FILE, read_override, write_override

PREFLIGHT_TIMEOUT_S = 10.0
"""One health check before the daemon starts; a slow server is the daemon's to retry."""

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


NODE_STATE_FILES = (AGENT_FILE, STATE_FILE, CONFIG_FILE)
"""Files ``grid allocator node start`` writes into its state dir (the agent's record, the
node's state, its configuration): a directory holding none of them has never had a node, so
an override set there would never be read (see :func:`_node_state_dir`)."""


def _node_state_dir(value: Path | None, *, override_counts: bool = False) -> Path:
    """The state dir of an existing node, for the commands that change its local override.

    Args:
        value: ``--state-dir`` as given (``None``: ``$GRID_NODE_STATE_DIR`` or
            ``$GRID_HOME/node``, resolved by the option and :func:`_state_dir`).
        override_counts: an override file alone is enough (``node resume`` may clear one
            left in a directory whose node state is gone).

    Raises:
        NotFoundError: the directory holds none of :data:`NODE_STATE_FILES` (a mistyped
            path, or a node never started there); nothing is created or written.
    """
    sdir = _state_dir(value)
    names = (*NODE_STATE_FILES, OVERRIDE_FILE) if override_counts else NODE_STATE_FILES
    if not any((sdir / name).exists() for name in names):
        msg = (
            f"no node agent in --state-dir {sdir} (none of {', '.join(NODE_STATE_FILES)}); "
            "give the state dir the node was started with (--state-dir or "
            "$GRID_NODE_STATE_DIR), or start one there with 'grid allocator node start'"
        )
        raise NotFoundError(msg)
    return sdir


def _grid_target(grid: str | None) -> GridTarget:
    """The grid ``--grid`` names (URL, configured name, ``local``), with its CA file."""
    return resolve_target(grid, grid_home())


def preflight(node: NodeConfig) -> None:
    """Reach the Grid once from the CLI before the daemon starts, so a refused certificate
    (wrong CA, expired, SAN mismatch) is one line here instead of a daemon's last error.
    An unreachable server is left to the daemon, which retries.

    Raises:
        TlsRefused: the server's certificate failed verification.
    """
    if not node.grid_url.startswith("https://"):
        return
    client = GridClient(node.grid_url, ca_file=node.grid_ca, timeout=PREFLIGHT_TIMEOUT_S)
    with client, contextlib.suppress(ServerUnreachable):
        client.send(Calls.healthz())


# The flags of `grid allocator node start`; most set one field of the node configuration.
GridCaOption = Annotated[
    Path | None,
    typer.Option("--grid-ca", help="CA certificate the https:// Grid is verified with."),
]
GridPeerOption = Annotated[
    list[str] | None,
    typer.Option(
        "--grid-peer",
        help="Another server of the same grid (servers on one etcd; repeatable): the "
        "agent registers with each and takes commands from the leader.",
    ),
]
JoinFileOption = Annotated[
    Path | None,
    typer.Option(
        "--join",
        help="Join file from 'grid allocator join write': URL, CA pin and a one-time token.",
    ),
]
NodeTokenFileOption = Annotated[
    Path | None,
    typer.Option("--token-file", help="Node credential file from 'grid allocator token write'."),
]
DedicatedOption = Annotated[
    bool,
    typer.Option("--dedicated", help="Always-on server: ignore battery and user activity."),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="Start from this node configuration document (flags given here override it).",
    ),
]
HostIdOption = Annotated[
    str | None,
    typer.Option("--host-id", envvar="GRID_NODE_HOST_ID", help="Stable host id override."),
]
PortRangeOption = Annotated[
    str | None,
    typer.Option(
        "--port-range",
        envvar="GRID_NODE_PORT_RANGE",
        help="Managed engine ports LOW-HIGH (default 22200-22299).",
    ),
]
CapacityShareOption = Annotated[
    float | None,
    typer.Option(
        "--capacity-share",
        envvar="GRID_NODE_CAPACITY_SHARE",
        help="Fraction of this machine's memory and disk this agent offers (default 1).",
    ),
]
ModelsDirOption = Annotated[
    list[Path] | None,
    typer.Option("--models-dir", help="Directory of local GGUFs (repeatable)."),
]
LlamaServerOption = Annotated[
    str | None, typer.Option("--llama-server", help="Explicit llama-server path.")
]
FailureDomainOption = Annotated[str | None, typer.Option("--failure-domain")]
TagOption = Annotated[list[str] | None, typer.Option("--tag", help="Placement tag.")]
RuntimeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--runtime",
        help="Offer only this runtime (repeatable, e.g. comfyui for a media node; "
        "default: every installed runtime plugin).",
    ),
]
HeartbeatIntervalOption = Annotated[
    float | None,
    typer.Option("--heartbeat-interval", help="Seconds between heartbeats (default 5)."),
]
ThrottleFractionOption = Annotated[
    float | None,
    typer.Option(
        "--throttle-fraction",
        help="Share of capacity offered while CPU-throttled (default 0.5).",
    ),
]
UnknownSensorsOption = Annotated[
    str | None,
    typer.Option(
        "--unknown-sensors",
        help="Missing sensors: ignore (default), or throttle conservatively.",
    ),
]
AdvertiseHostOption = Annotated[
    str | None,
    typer.Option(
        "--advertise-host",
        help="Name or IP the server reaches this machine's engines at (off loopback: TLS).",
    ),
]
EngineTlsCertOption = Annotated[
    Path | None,
    typer.Option("--engine-tls-cert", help="PEM chain whose SAN covers --advertise-host."),
]
EngineTlsKeyOption = Annotated[
    Path | None,
    typer.Option("--engine-tls-key", help="Its private key (owner-only, mode 0600)."),
]
EngineTlsCaOption = Annotated[
    Path | None,
    typer.Option("--engine-tls-ca", help="CA the server verifies the engines with."),
]


def start(
    grid: GridOption = None,
    grid_ca: GridCaOption = None,
    grid_peer: GridPeerOption = None,
    join_file: JoinFileOption = None,
    token_file: NodeTokenFileOption = None,
    dedicated: DedicatedOption = False,
    state_dir: StateDir = None,
    config: ConfigOption = None,
    host_id: HostIdOption = None,
    port_range: PortRangeOption = None,
    capacity_share: CapacityShareOption = None,
    models_dir: ModelsDirOption = None,
    llama_server: LlamaServerOption = None,
    failure_domain: FailureDomainOption = None,
    tag: TagOption = None,
    runtime: RuntimeOption = None,
    heartbeat_interval: HeartbeatIntervalOption = None,
    throttle_fraction: ThrottleFractionOption = None,
    unknown_sensors: UnknownSensorsOption = None,
    advertise_host: AdvertiseHostOption = None,
    engine_tls_cert: EngineTlsCertOption = None,
    engine_tls_key: EngineTlsKeyOption = None,
    engine_tls_ca: EngineTlsCaOption = None,
) -> None:
    """Start this machine's node agent in the background and wait until it has registered.

    The flags become the node configuration document ``$STATE_DIR/node-config.json`` (its
    defaults and bounds are those of ``grid_core.nodeconfig.NodeConfig``); the daemon reads
    only that document.
    """
    fields: dict[str, object] = {}
    if config is not None:
        fields = msgspec.structs.asdict(load_config(config))
    given: dict[str, object] = {
        "state_dir": state_dir,
        "token_file": token_file,
        "host_id": host_id,
        "port_range": parse_port_range(port_range) if port_range is not None else None,
        "capacity_share": capacity_share,
        "model_dirs": tuple(models_dir) if models_dir else None,
        "llama_server": llama_server,
        "failure_domain": failure_domain,
        "tags": tuple(tag) if tag else None,
        "runtimes": tuple(runtime) if runtime else None,
        "heartbeat_interval_s": heartbeat_interval,
        "throttle_fraction": throttle_fraction,
        "unknown_sensors": unknown_sensors,
        "dedicated": True if dedicated else None,
        "advertise_host": advertise_host,
        "engine_tls_cert": engine_tls_cert,
        "engine_tls_key": engine_tls_key,
        "engine_tls_ca": engine_tls_ca,
        "peer_urls": tuple(grid_peer) if grid_peer else None,
    }
    fields.update({k: v for k, v in given.items() if v is not None})
    if "state_dir" not in fields:
        fields["state_dir"] = _state_dir(None)
    _add_grid_target(fields, grid, grid_ca, token_file, join_file, config)
    node = NodeConfig(**fields)  # type: ignore[arg-type]  # each value is checked in __post_init__
    preflight(node)
    rec = start_node(node)
    typer.echo(
        f"node agent started: host {rec.host_id} pid {rec.pid} grid {rec.grid_url} "
        f"config {node.path}"
    )


def _add_grid_target(
    fields: dict[str, object],
    grid: str | None,
    grid_ca: Path | None,
    token_file: Path | None,
    join_file: Path | None,
    config: Path | None,
) -> None:
    """Add where the node registers (``grid_url``, ``grid_ca``, ``token_file``) to ``fields``.

    A join file is spent here (its one-time token becomes the node credential) only after
    every other field has been checked; otherwise ``--grid`` or the configured grid decides.

    Raises:
        ValidationError: ``--join`` given with ``--grid``, ``--token-file`` or ``--grid-ca``,
            or a field of the configuration is invalid.
    """
    if join_file is not None:
        if grid is not None or token_file is not None or grid_ca is not None:
            msg = (
                "--join carries the Grid URL, its CA and the credential: drop --grid, "
                "--token-file and --grid-ca"
            )
            raise ValidationError(msg)
        doc = read_join_file(join_file)
        fields.update(grid_url=doc.grid_url, host_id=doc.host_id)
        checked = NodeConfig(**fields)  # type: ignore[arg-type]  # every flag checked before the token is spent
        joined = join(join_file, checked.state_dir)
        typer.echo(f"joined {joined.grid_url} as host {joined.host_id}")
        fields.update(token_file=joined.token_file, grid_ca=joined.ca_file)
    elif grid is not None or config is None:
        target = _grid_target(grid)
        fields["grid_url"] = target.url
        if grid_ca is None and target.ca_file is not None:
            fields["grid_ca"] = target.ca_file
        if token_file is None and target.node_token_file is not None:
            fields["token_file"] = target.node_token_file
    if grid_ca is not None:
        fields["grid_ca"] = grid_ca


def status(
    state_dir: StateDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Show this node: daemon, protection state, override, children and recent events."""
    from grid_node.state import StateFile

    sdir = _state_dir(state_dir)
    rec = agent_record(sdir)
    proof = rec.proof() if rec else None
    state = StateFile(sdir).load()
    if rec is None and state is None:
        # Nothing was ever started here: a table of "None" fields would only mislead.
        msg = (
            f"no node agent in STATE_DIR {sdir}; start one with 'grid allocator node start' "
            "(or pass --state-dir)"
        )
        raise NotFoundError(msg)
    override = read_override(sdir)
    doc: dict[str, Any] = {
        "state_dir": str(sdir),
        "daemon": {
            "pid": rec.pid if rec else None,
            "running": bool(proof and proof.status == "proven"),
            "proof": proof.reason if proof else "no agent record",
            "registered": rec.registered if rec else None,
            "last_error": rec.last_error if rec else None,
            "grid_url": rec.grid_url if rec else None,
        },
        "host_id": state.host_id if state else None,
        "protection": {"state": rec.state if rec else None, "reason": rec.reason if rec else None},
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
        "events": rec.events if rec else [],
    }
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        _print_status(doc)


def _print_status(doc: dict[str, Any]) -> None:
    """Render the ``grid allocator node status`` document as lines and a children table."""
    from grid_core.table import render_table

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
    for line in stop_node(_state_dir(state_dir), force=force):
        typer.echo(line)


def _set_override(
    kind: OverrideKind, reason: str, for_seconds: float | None, state_dir: Path | None
) -> None:
    if not reason.strip():
        raise ValidationError("--reason must say why (it is shown in status)")
    # NaN compares false with everything and both NaN and inf are written as null, an
    # override that never lapses: only a finite positive duration is one.
    if for_seconds is not None and not (math.isfinite(for_seconds) and for_seconds > 0):
        msg = (
            f"--for-seconds must be a finite positive number of seconds (got {for_seconds}); "
            "omit it for an override that lasts until 'grid allocator node resume'"
        )
        raise ValidationError(msg)
    sdir = _node_state_dir(state_dir)
    now = time.time()
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
    sdir = _node_state_dir(state_dir, override_counts=True)
    previous = read_override(sdir)
    write_override(sdir, None)
    typer.echo("local override cleared" if previous else "no local override was set")


def rotate_engine_key(
    state_dir: StateDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Give this node a fresh engine key (the agent must be stopped; the key is never shown).

    The next 'grid allocator node start' registers the new key, and the server uses it for
    every request it relays to this node's engines from then on.
    """
    from grid_node.state import StateFile

    sdir = _node_state_dir(state_dir)
    rec = agent_record(sdir)
    if rec is not None and agent_running(sdir):
        # The proven daemon is named first; the state's instance lock then closes the race
        # with an agent that starts meanwhile.
        msg = (
            f"the node agent (pid {rec.pid}) is running for {sdir}; stop it first with "
            f"'grid allocator node stop --state-dir {sdir}', rotate, then start it again"
        )
        raise ConflictError(msg)
    state = StateFile(sdir).rotate_engine_key()
    if as_json:
        doc = {"state_dir": str(sdir), "host_id": state.host_id, "engine_key_rotated": True}
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(
        f"engine key of host {state.host_id} replaced in {sdir} (not shown); start the node "
        f"again so it registers the new key: 'grid allocator node start --state-dir {sdir} "
        f"--config {sdir / CONFIG_FILE}' reuses the options it last started with"
    )


def _same_server(a: str, b: str) -> bool:
    """Whether two base URLs name the same local server (loopback names count as one)."""
    from urllib.parse import urlsplit

    from grid_core.client import is_loopback_host

    pa, pb = urlsplit(a), urlsplit(b)
    if pa.port != pb.port or pa.scheme != pb.scheme:
        return False
    ha, hb = pa.hostname or "", pb.hostname or ""
    return ha == hb or (is_loopback_host(ha) and is_loopback_host(hb))


def stop_local_node(server_url: str) -> list[str]:
    """``grid down``'s first step: stop this machine's managed node if it serves
    ``server_url`` (the default state dir, or ``$GRID_NODE_STATE_DIR``).

    Raises:
        ConflictError: the recorded daemon PID is alive but not provably the node.
        UnavailableError: the node is still draining after the stop budget.
    """
    import os

    sdir = _state_dir(
        Path(os.environ["GRID_NODE_STATE_DIR"]) if os.environ.get("GRID_NODE_STATE_DIR") else None
    )
    rec = agent_record(sdir)
    proof = rec.proof() if rec else None
    if rec is None or proof is None or proof.status != "proven":
        return []
    if not rec.grid_url or not _same_server(rec.grid_url, server_url):
        return []
    return [f"grid: stopping the managed node {rec.host_id} first", *stop_node(sdir)]


def register(cli: CliRegistry) -> None:
    """Mount the node commands on ``grid allocator node``."""
    cli.on_server_stop(stop_local_node)
    node = cli.subgroup("allocator", "node", help="This machine's managed node agent.")
    for fn in (start, status, stop, drain, pause, quarantine, resume):
        node.command(name=fn.__name__)(fn)
    node.command(name="rotate-engine-key")(rotate_engine_key)
    from grid_node.cli_qualify import qualify

    cli.group("allocator").command(name="qualify")(qualify)
    from grid_node.cli_join import join_command

    cli.command(join_command, name="join")
