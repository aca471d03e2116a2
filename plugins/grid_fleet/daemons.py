"""The logical fleet's daemons: its server process, its host agents, and every process of it.

Starting and stopping one daemon, and finding the processes that belong to a fleet however
they were started; :mod:`grid_fleet.lifecycle` composes these into ``grid test start``,
``stop`` and ``restart``. The server is ``python -m grid_server.serve``; each host credential
is issued through ``POST /allocator/tokens`` into an owner-only file; host agents start and
stop through the node launcher of the public plugin API (``NodeLauncher``, which the node
package provides), by their saved configuration documents. Processes are only ever signalled after
an identity proof (PID + birth time + a command-line marker).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import msgspec

from grid_core.api import (
    SAFE_PATH_FLAG,
    Call,
    Calls,
    GridClient,
    GridError,
    NodeConfig,
    NodeLauncher,
    NodeProcesses,
    ProcessIdentity,
    RequestRefused,
    SpawnedChild,
    UnavailableError,
    exit_status,
    get_plugins,
    spawn_detached,
    stop_process_sync,
    wait_until_sync,
    write_atomic,
)
from grid_fleet import layout, media
from grid_fleet.layout import FleetRecord, HostSpec, ProcessRecord

SERVER_START_S = 30.0
"""The server binds and answers /healthz within a second or two; 30 s covers a busy machine."""
SERVER_STOP_S = 20.0
"""Graceful server shutdown budget before SIGKILL (the server has no children of its own)."""
HTTP_TIMEOUT_S = 30.0
TOKEN_TTL_S = 7 * 86400.0
"""Fleet node credentials last a week: a persistent fixture survives a working week."""
POLL_S = 0.2
TOKEN_HINT = "$GRID_HOME/operator-token"
"""How Grid's own messages name the operator token; inside the fleet that is fleet/server/."""
LOG_TAIL_LINES = 5
"""Server log lines quoted when the fleet server fails to start."""
ENGINE_THREADS_ENV = "LLAMA_ARG_THREADS"
ENGINE_THREADS = 1
"""Threads per engine child: logical hosts share the physical cores, and a tiny model gains
nothing from a second thread that only contends with the sibling engines."""

Echo = Callable[[str], None]
T = TypeVar("T")


def token_path(root: Path) -> Path:
    """The fleet server's operator token (its GRID_HOME is ``fleet/server``)."""
    return root / "server" / "operator-token"


def operator_token(root: Path) -> str:
    return token_path(root).read_text().strip()


def api(url: str, root: Path, call: Call[T]) -> T:
    """Send one operator call to the fleet's server with the fleet's operator token.

    Raises:
        UnavailableError: the server refused the call or did not answer (one line).
    """
    try:
        with GridClient(url, operator_token=operator_token(root), timeout=HTTP_TIMEOUT_S) as c:
            return c.send(call)
    except RequestRefused as exc:
        if exc.status in (401, 403):
            # The server's own hint names $GRID_HOME/operator-token; the fleet server's home
            # is fleet/server, so name the file that was actually sent.
            msg = (
                f"{call.method} {call.path} → {exc.status}: the server refused the fleet's "
                f"operator token {token_path(root)}"
            )
            raise UnavailableError(msg) from None
        raise UnavailableError(str(exc)) from None
    except GridError as exc:
        raise UnavailableError(str(exc)) from None


# --- server -----------------------------------------------------------------------------
def server_proof(rec: ProcessRecord | None) -> str:
    """``proven``, ``dead`` or ``unproven`` for the recorded server process."""
    if rec is None:
        return "dead"
    return rec.identity().prove().status


def start_server(root: Path, port: int, *, fresh_log: bool = True) -> tuple[ProcessRecord, str]:
    home = root / "server"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    url_file = root / "server-url.json"
    url_file.unlink(missing_ok=True)
    policy = root / "policy.json"
    write_atomic(policy, json.dumps(layout.policy_document(), indent=2) + "\n")
    argv = [
        sys.executable,
        SAFE_PATH_FLAG,
        "-m",
        "grid_server.serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--url-file",
        str(url_file),
        "--policy",
        str(policy),
        "--tick-interval",
        "2",
    ]
    env = dict(os.environ, GRID_HOME=str(home))
    # A fresh log per run: an error quotes its tail, which must be this run's text only. A
    # restart appends, so the killed server's last lines stay readable.
    log_path = root / "server.log"
    pid = spawn_detached(argv, log_path=log_path, env=env, truncate_log=fresh_log)
    try:
        return _await_server(pid, url_file, log_path)
    except BaseException:
        # Not yet in fleet.json: nobody else could stop it, so stop it here.
        stop_process_sync(SpawnedChild(pid), grace_s=SERVER_STOP_S)
        raise


def _await_server(pid: int, url_file: Path, log_path: Path) -> tuple[ProcessRecord, str]:
    def announced() -> tuple[ProcessRecord, str] | None:
        code = exit_status(pid)
        if code is not None:
            tail = log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            msg = f"the fleet server exited ({code}); {log_path} ends with:\n" + (
                "\n".join(tail) or "(empty)"
            )
            raise UnavailableError(msg)
        try:
            doc = json.loads(url_file.read_text())
            if doc.get("pid") == pid:
                rec = ProcessRecord(
                    pid=pid, birth=float(doc["create_time"]), marker=("--url-file", str(url_file))
                )
                return rec, str(doc["url"])
        except (OSError, ValueError, KeyError):
            pass
        return None

    found = wait_until_sync(announced, timeout_s=SERVER_START_S, interval_s=POLL_S)
    if found is None:
        msg = f"the fleet server did not start within {SERVER_START_S:.0f} s; see {log_path}"
        raise UnavailableError(msg)
    return found


def stop_server(rec: ProcessRecord | None, echo: Echo) -> None:
    if rec is None:
        return
    proof = rec.identity().prove()
    if proof.status == "dead":
        return
    if proof.status != "proven":
        echo(f"  not signalling pid {rec.pid}: {proof.reason} (inspect it by hand)")
        return
    try:
        stop_process_sync(rec.identity(), grace_s=SERVER_STOP_S)
    except GridError as exc:
        echo(f"  server pid {rec.pid}: {exc}")
        return
    echo(f"  server pid {rec.pid} stopped")


# --- hosts --------------------------------------------------------------------------------
def _credential(root: Path, url: str, host: HostSpec) -> Path:
    """The host's node credential file (0600), issued once through the operator API."""
    tokens = root / "tokens"
    tokens.mkdir(mode=0o700, exist_ok=True)
    token_file = tokens / f"{host.host_id}.token"
    if not token_file.exists():
        issued = api(url, root, Calls.issue_node_credential(host.host_id, TOKEN_TTL_S))
        write_atomic(token_file, msgspec.json.encode(issued) + b"\n")
    return token_file


def _start_host(
    root: Path, url: str, host: HostSpec, launcher: NodeLauncher
) -> tuple[str, int, str]:
    """Write the host's node configuration document and start its daemon through ``launcher``.

    Returns:
        ``(host_id, 0, "")`` on success, else ``(host_id, exit code, one-line reason)``.
    """
    # Every logical host's engines share this machine's few cores: one thread per engine
    # keeps N engines from spinning against each other (llama-server reads this variable).
    env = dict(os.environ, GRID_HOME=str(root / "server"))
    env.setdefault(ENGINE_THREADS_ENV, str(ENGINE_THREADS))
    model_dirs = (root / "models",)
    if host.comfyui_url:
        # The media node: its ComfyUI runtime plugin talks to the fixture's ComfyUI and
        # finds the bundle's workflow manifests.
        env[media.URL_ENV] = host.comfyui_url
        model_dirs = (media.model_dir(root),)
    try:
        config = NodeConfig(
            state_dir=root / "hosts" / host.host_id,
            grid_url=url,
            token_file=_credential(root, url, host),
            host_id=host.host_id,
            failure_domain=host.failure_domain,
            port_range=(host.port_low, host.port_high),
            capacity_share=host.capacity_share,
            model_dirs=model_dirs,
            runtimes=host.runtimes,
            dedicated=True,
            heartbeat_interval_s=layout.HEARTBEAT_INTERVAL_S,
            throttle_fraction=layout.THROTTLED_FRACTION,
        )
        launcher.start(config.save(), env=env)
    except GridError as exc:
        return host.host_id, exc.exit_code or 1, str(exc)
    return host.host_id, 0, ""


def node_launcher() -> NodeLauncher:
    """The node package's launcher (the ``grid_node_launcher`` hook): the fleet starts, reads
    and stops its agents only through it, by their configuration documents."""
    return get_plugins().node_launcher()


def node_processes(root: Path, host_id: str) -> NodeProcesses:
    """The host's recorded node agent (pid, birth, proven or not) and engine children."""
    return node_launcher().processes(root / "hosts" / host_id)


def node_running(root: Path, host_id: str) -> bool:
    """True when the host's node agent is alive and provably itself."""
    return node_processes(root, host_id).agent_running


def start_hosts(root: Path, url: str, hosts: tuple[HostSpec, ...], echo: Echo) -> None:
    launcher = node_launcher()  # loads the plugins once, before the worker threads
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        results = list(pool.map(lambda h: _start_host(root, url, h, launcher), hosts))
    failed = [(hid, out) for hid, code, out in results if code]
    for h in hosts:
        if not any(hid == h.host_id for hid, _ in failed):
            echo(
                f"  {h.host_id}: {h.capacity_mb} MB ({h.capacity_share:.3f} of RAM), "
                f"domain {h.failure_domain}, ports {h.port_low}-{h.port_high}"
            )
    if failed:
        # The token-write/node-start hints say $GRID_HOME/operator-token, relative to the
        # fleet server's home, not the operator's GRID_HOME: name the real file instead.
        real = str(token_path(root))
        lines = "\n".join(
            f"  {hid}: {(out.splitlines()[-1] if out else '?').replace(TOKEN_HINT, real)}"
            for hid, out in failed
        )
        msg = f"{len(failed)} logical host(s) did not start:\n{lines}"
        raise UnavailableError(msg)


# --- processes ----------------------------------------------------------------------------
def owned_pids(root: Path, rec: FleetRecord) -> list[tuple[int, float | None]]:
    """Every (pid, birth) the fleet started: server, agents, engine children."""
    out: list[tuple[int, float | None]] = []
    if rec.server is not None:
        out.append((rec.server.pid, rec.server.birth))
    if rec.comfyui is not None:
        out.append((rec.comfyui.pid, rec.comfyui.birth))
    for h in rec.hosts:
        node = node_processes(root, h.host_id)
        if node.agent_pid:
            out.append((node.agent_pid, node.agent_birth))
        out.extend(node.engines)
    return out


def fleet_processes(root: Path) -> list[ProcessIdentity]:
    """Every live process that belongs to the fleet in ``root``, however it was started.

    A process belongs to the fleet when its command line names a path under ``root`` (the
    server's url file, an agent's config, an engine's model or key file) or when its
    ``GRID_HOME`` is under ``root`` (a server restarted by hand with the fleet's home). This
    process and its ancestors are never listed. Each entry is a full identity (pid, birth,
    exact command line) so a later signal goes only to the process that was found.
    """
    import psutil

    marker = str(root)
    skip = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    out: list[ProcessIdentity] = []
    for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
        if proc.pid in skip:
            continue
        try:
            cmd = proc.info.get("cmdline") or []
            mine = any(marker in part for part in cmd)
            if not mine:
                home = proc.environ().get("GRID_HOME", "")
                mine = bool(home) and (home == marker or home.startswith(marker + os.sep))
        except (psutil.Error, AttributeError, OSError):
            continue
        if mine:
            out.append(ProcessIdentity(proc.pid, proc.info.get("create_time"), cmdline=tuple(cmd)))
    return out


def stray_processes(root: Path) -> list[int]:
    """PIDs of :func:`fleet_processes` (after a clean stop this is empty: no server, agent
    or engine of the fleet is left, including one an operator started by hand)."""
    return [p.pid for p in fleet_processes(root)]


def stop_strays(root: Path, echo: Echo) -> None:
    """Stop fleet processes the record does not name (a server restarted by hand, an engine
    whose agent lost its record): SIGTERM, then SIGKILL after the server's grace, each only
    while pid, birth and exact command line still prove the process found."""
    for ident in fleet_processes(root):
        proof = ident.prove()
        if proof.status != "proven":
            continue
        try:
            outcome = stop_process_sync(ident, grace_s=SERVER_STOP_S)
        except GridError as exc:
            echo(f"  pid {ident.pid} ({_short(ident)}): {exc}")
            continue
        echo(f"  pid {ident.pid} ({_short(ident)}) was not in the fleet record: {outcome}")


def _short(ident: ProcessIdentity) -> str:
    cmd = ident.cmdline or ()
    return " ".join(Path(part).name if os.sep in part else part for part in cmd[:4])[:80]


def is_server(ident: ProcessIdentity) -> bool:
    cmd = ident.cmdline or ()
    return "grid_server.serve" in cmd or any(part.endswith("grid") for part in cmd[:2])
