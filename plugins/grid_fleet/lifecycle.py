"""Start and stop the logical fleet: one real server, N real node agents, real engines.

Source: the specification's "Single-machine scenario lab and logical fleet test" and "CLI
workflow" (token write, node start/stop). The fleet drives the shipped pieces as an operator
would: ``python -m grid_server.serve`` for the API, ``POST /allocator/tokens`` + an owner-only
file for each host credential, the node API behind ``grid allocator node start/stop``
(:mod:`grid_node.launch`: one configuration document per logical host, then the daemon) and
``PUT /allocator/models/…`` / ``PUT /allocator/mode`` through the typed client.

Processes are only ever signalled after an identity proof (PID + birth time + a command-line
marker); node agents and their engine children are stopped by the node's own graceful stop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import msgspec

from grid_core.api import (
    Call,
    Calls,
    ConflictError,
    GridClient,
    GridError,
    ProcessIdentity,
    RequestRefused,
    SpawnedChild,
    UnavailableError,
    ValidationError,
    exit_status,
    is_gone,
    same_birth,
    spawn_detached,
    stop_process_sync,
    wait_until_sync,
    write_atomic,
)
from grid_fleet import layout
from grid_fleet.layout import FleetRecord, FleetSettings, HostSpec, ModelSpec, ProcessRecord
from grid_node.config import NodeConfig
from grid_node.launch import (
    AgentRecord,
    agent_record,
    agent_running,
    engine_processes,
    start_node,
    stop_node,
)

SERVER_START_S = 30.0
"""The server binds and answers /healthz within a second or two; 30 s covers a busy machine."""
SERVER_STOP_S = 20.0
"""Graceful server shutdown budget before SIGKILL (the server has no children of its own)."""
HTTP_TIMEOUT_S = 30.0
TOKEN_TTL_S = 7 * 86400.0
"""Fleet node credentials last a week: a persistent fixture survives a working week."""
POLL_S = 0.2
BASELINE_READY_S = 120.0
"""Start waits this long for the baseline replica: a tiny model warms in seconds."""
GGUF_MAGIC = b"GGUF"
"""First four bytes of every GGUF file (the format's magic number)."""
TOKEN_HINT = "$GRID_HOME/operator-token"
"""How Grid's own messages name the operator token; inside the fleet that is fleet/server/."""
LOCK_FILE = "fleet.lock"
"""Exclusive lock held by ``grid test start``/``stop`` (one fleet operation at a time)."""
LOG_TAIL_LINES = 5
"""Server log lines quoted when the fleet server fails to start."""
MAKE_MODEL_TIMEOUT_S = 120.0
"""A tiny demo GGUF is written in about a second; two minutes covers a loaded CI machine."""
ENGINE_THREADS_ENV = "LLAMA_ARG_THREADS"
ENGINE_THREADS = 1
"""Threads per engine child: logical hosts share the physical cores, and a tiny model gains
nothing from a second thread that only contends with the sibling engines."""

Echo = Callable[[str], None]
T = TypeVar("T")


def grid_exe() -> list[str]:
    """How to run the ``grid`` CLI of this very installation."""
    return [sys.executable, "-c", "from grid_core.cli import main; main()"]


def token_path(root: Path) -> Path:
    """The fleet server's operator token (its GRID_HOME is ``fleet/server``)."""
    return root / "server" / "operator-token"


def operator_token(root: Path) -> str:
    return token_path(root).read_text().strip()


def _api(url: str, root: Path, call: Call[T]) -> T:
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


# --- models -----------------------------------------------------------------------------
def check_gguf(path: Path) -> None:
    """Refuse an operator ``--model`` that is not a readable GGUF file, before starting anything.

    Raises:
        ValidationError: the file is missing, unreadable or lacks the GGUF magic bytes.
    """
    try:
        with path.open("rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except IsADirectoryError:
        msg = f"--model {path}: is a directory, not a GGUF file"
        raise ValidationError(msg) from None
    except FileNotFoundError:
        msg = f"--model {path}: no such file"
        raise ValidationError(msg) from None
    except OSError as exc:
        msg = f"--model {path}: cannot read it ({exc.strerror or exc})"
        raise ValidationError(msg) from None
    if head != GGUF_MAGIC:
        msg = f"--model {path}: not a GGUF file (it does not start with the GGUF magic bytes)"
        raise ValidationError(msg)


def prepare_models(root: Path, settings: FleetSettings, echo: Echo) -> tuple[ModelSpec, ...]:
    """Generate the three default tiny models (or describe the operator's GGUFs).

    Raises:
        ValidationError: an operator ``--model`` path is missing or not a ``.gguf``.
    """
    small = min(settings.capacities_mb)
    models_dir = root / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    out: list[ModelSpec] = []
    if settings.models:
        for i, raw in enumerate(settings.models):
            path = Path(raw)
            check_gguf(path)
            link = models_dir / path.name
            if link.is_symlink() and link.resolve() != path.resolve():
                link.unlink()  # an earlier fleet's file of the same name
            if not link.exists():
                link.symlink_to(path)
            out.append(
                ModelSpec(
                    model_id=path.name,
                    path=str(path),
                    sha256=layout.sha256_of(path),
                    memory_mb=int(small * layout.OPERATOR_MODEL_SHARE),
                    priority=50 - 10 * i,
                    min_replicas=1 if i == 0 else 0,
                    max_replicas=min(3, settings.machines) if i == 0 else 1,
                )
            )
        return tuple(out)
    for i, m in enumerate(layout.DEFAULT_MODELS):
        path = models_dir / f"{m['name']}.gguf"
        if not path.exists():
            size = make_tiny_model(path, m["name"], m["layers"], m["embedding"], seed=i)
            echo(f"  made {path.name} ({size / 1e6:.1f} MB file)")
        out.append(
            ModelSpec(
                model_id=path.name,
                path=str(path),
                sha256=layout.sha256_of(path),
                memory_mb=int(small * m["share"]),
                priority=m["priority"],
                min_replicas=m["min_replicas"],
                max_replicas=min(m["max_replicas"], settings.machines),
            )
        )
    return tuple(out)


def make_tiny_model(path: Path, name: str, layers: int, embedding: int, *, seed: int) -> int:
    """Write one demo GGUF through ``grid test make-model`` (the llama.cpp plugin's command).

    The fleet drives the llama.cpp plugin through its public command, as an operator would,
    rather than importing another plugin's internals.

    Returns:
        The file size in bytes.

    Raises:
        GridError: the command failed (its last output line is the message).
    """
    argv = [
        *grid_exe(),
        "test",
        "make-model",
        str(path),
        "--name",
        name,
        "--layers",
        str(layers),
        "--embedding",
        str(embedding),
        "--context",
        str(layout.MODEL_CONTEXT),
        "--seed",
        str(seed),
    ]
    done = subprocess.run(
        argv, capture_output=True, text=True, check=False, timeout=MAKE_MODEL_TIMEOUT_S
    )
    if done.returncode != 0 or not path.is_file():
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        msg = f"making the demo model {path.name} failed: {lines[-1]}"
        raise GridError(msg)
    return path.stat().st_size


# --- server -----------------------------------------------------------------------------
def server_proof(rec: ProcessRecord | None) -> str:
    """``proven``, ``dead`` or ``unproven`` for the recorded server process."""
    if rec is None:
        return "dead"
    return rec.identity().prove().status


def _start_server(root: Path, port: int, *, fresh_log: bool = True) -> tuple[ProcessRecord, str]:
    home = root / "server"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    url_file = root / "server-url.json"
    url_file.unlink(missing_ok=True)
    policy = root / "policy.json"
    write_atomic(policy, json.dumps(layout.policy_document(), indent=2) + "\n")
    argv = [
        sys.executable,
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


def _stop_server(rec: ProcessRecord | None, echo: Echo) -> None:
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
        issued = _api(url, root, Calls.issue_node_credential(host.host_id, TOKEN_TTL_S))
        write_atomic(token_file, msgspec.json.encode(issued) + b"\n")
    return token_file


def _start_host(root: Path, url: str, host: HostSpec) -> tuple[str, int, str]:
    """Write the host's node configuration document and start its daemon (grid_node API).

    Returns:
        ``(host_id, 0, "")`` on success, else ``(host_id, exit code, one-line reason)``.
    """
    # Every logical host's engines share this machine's few cores: one thread per engine
    # keeps N engines from spinning against each other (llama-server reads this variable).
    env = dict(os.environ, GRID_HOME=str(root / "server"))
    env.setdefault(ENGINE_THREADS_ENV, str(ENGINE_THREADS))
    try:
        config = NodeConfig(
            state_dir=root / "hosts" / host.host_id,
            grid_url=url,
            token_file=_credential(root, url, host),
            host_id=host.host_id,
            failure_domain=host.failure_domain,
            port_range=(host.port_low, host.port_high),
            capacity_share=host.capacity_share,
            model_dirs=(root / "models",),
            dedicated=True,
            heartbeat_interval_s=layout.HEARTBEAT_INTERVAL_S,
            throttle_fraction=layout.THROTTLED_FRACTION,
        )
        start_node(config, env=env)
    except GridError as exc:
        return host.host_id, exc.exit_code or 1, str(exc)
    return host.host_id, 0, ""


def node_record(root: Path, host_id: str) -> AgentRecord | None:
    """The node agent's own record (pid, birth, instance) from its state directory."""
    return agent_record(root / "hosts" / host_id)


def node_running(root: Path, host_id: str) -> bool:
    """True when the host's node agent is alive and provably itself."""
    return agent_running(root / "hosts" / host_id)


# --- exclusivity and termination -----------------------------------------------------------
class Terminated(GridError):
    """SIGTERM arrived during ``grid test start``; what the start launched was stopped."""

    exit_code = 128 + signal.SIGTERM


@contextmanager
def exclusive(root: Path) -> Iterator[None]:
    """Hold the fleet's lock file for one start or stop.

    Raises:
        ConflictError: another start/stop holds it (two would delete each other's state).
    """
    import filelock

    root.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(root / LOCK_FILE))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        msg = (
            f"another grid test start/stop is running on GRID_HOME={root.parent}; "
            "wait for it to finish"
        )
        raise ConflictError(msg) from None
    try:
        yield
    finally:
        lock.release()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn the first SIGTERM into :class:`Terminated` so start's cleanup path runs.

    Ctrl-C already raises ``KeyboardInterrupt``; a service manager or ``kill`` sends SIGTERM,
    which would otherwise end the process and leave a half-started fleet. Later SIGTERMs are
    ignored while the cleanup runs. Only the main thread can install handlers; elsewhere this
    does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def handler(signum: int, frame: object) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        msg = "terminated by SIGTERM; stopped what this start had launched"
        raise Terminated(msg)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- start / stop -------------------------------------------------------------------------
def start(settings: FleetSettings, echo: Echo, root: Path | None = None) -> FleetRecord:
    """Start (or confirm) the fleet described by ``settings``.

    Idempotent: a running fleet with identical settings is reused (missing host agents are
    restarted); different settings are refused with the differing fields named. Holds the
    fleet lock throughout; SIGTERM is handled like Ctrl-C.

    Raises:
        ConflictError: a fleet with other settings runs here, or another start/stop is
            running on this GRID_HOME.
        ValidationError: an operator ``--model`` is not a readable GGUF.
        UnavailableError: the server or a host did not come up, or the baseline failed
            (everything started by this call is stopped again before raising).
        Terminated: SIGTERM arrived (everything started by this call is stopped first).
    """
    root = root or layout.fleet_dir()
    for raw in settings.models:
        check_gguf(Path(raw))
    with exclusive(root), sigterm_as_interrupt():
        return _start(settings, echo, root)


def _start(settings: FleetSettings, echo: Echo, root: Path) -> FleetRecord:
    existing = layout.load_record(root)
    if existing is not None and server_proof(existing.server) == "proven":
        if existing.settings != settings:
            running = existing.settings
            diff = [
                f"{f}: running {getattr(running, f)!r}, asked {getattr(settings, f)!r}"
                for f in running.__struct_fields__
                if getattr(running, f) != getattr(settings, f)
            ]
            msg = (
                "a fleet with different settings is running ("
                + "; ".join(diff)
                + "); run 'grid test stop' first"
            )
            raise ConflictError(msg)
        missing = [h for h in existing.hosts if not node_running(root, h.host_id)]
        if not missing:
            echo(f"grid: the fleet is already running at {existing.url} (same settings)")
            return existing
        echo(f"grid: restarting {len(missing)} stopped host agent(s)")
        _start_hosts(root, existing.url, tuple(missing), echo)
        return existing
    if existing is not None and server_proof(existing.server) == "unproven":
        msg = (
            f"pid {existing.server.pid if existing.server else '?'} in "
            f"{layout.record_path(root)} is alive but not provably the fleet server; "
            "inspect it by hand"
        )
        raise ConflictError(msg)
    hosts = layout.host_specs(settings.capacities_mb, settings.engine_port_base)
    _fresh(root)
    echo(f"grid: starting a logical fleet of {settings.machines} host(s) in {root}")
    models = prepare_models(root, settings, echo)
    server, url = _start_server(root, settings.port)
    rec = FleetRecord(
        settings=settings,
        url=url,
        hosts=hosts,
        models=models,
        server=server,
        started_at=time.time(),
    )
    layout.save_record(root, rec)
    echo(f"  server pid {server.pid} on {url}")
    try:
        for m in models:
            _api(url, root, Calls.put_model(m.model_id, layout.profile_document(m)))
            echo(
                f"  profile {m.model_id}: {m.memory_mb} MB, priority {m.priority}, "
                f"replicas {m.min_replicas}..{m.max_replicas}"
            )
        _start_hosts(root, url, hosts, echo)
        mode = _api(url, root, Calls.set_mode("automatic"))
        if mode.get("mode") != "automatic":
            msg = f"the server refused automatic mode: {mode}"
            raise UnavailableError(msg)
        _wait_baseline(url, root, models, echo)
    except BaseException:
        echo("grid: start failed; stopping what was started")
        _stop(echo, root)
        raise
    return rec


def _fresh(root: Path) -> None:
    """Forget a stopped fleet's controller and node state (a new start is a new fleet).

    Old node state would carry the previous controller's term and receipts, and old
    controller state a restart grace; the operator token, signing key and models stay.

    Raises:
        ConflictError: a process from an earlier fleet still runs here.
    """
    import shutil

    stray = stray_processes(root)
    if stray:
        msg = (
            f"processes of this fleet still run ({stray}) while its server is down; "
            "'grid test restart' brings the server back, 'grid test stop' stops them all"
        )
        raise ConflictError(msg)
    for sub in (root / "server" / "state", root / "hosts", root / "tokens"):
        shutil.rmtree(sub, ignore_errors=True)


def _wait_baseline(url: str, root: Path, models: tuple[ModelSpec, ...], echo: Echo) -> None:
    """Wait until every baseline model answers on ``/v1/models`` (a ready route).

    Raises:
        UnavailableError: a load/warm of a baseline model failed (read from the allocator
            status, so a broken model fails in seconds), or the deadline passed. The message
            names the engine logs, which stay on disk after the failed start is stopped.
    """
    from rich.console import Console

    want = {m.model_id for m in models if m.min_replicas > 0}
    # A live spinner on a terminal (stderr, so --json stays clean); nothing on a pipe.
    console = Console(stderr=True)
    with (
        GridClient(url, timeout=HTTP_TIMEOUT_S) as client,
        console.status("  waiting for the baseline to load and warm") as spinner,
    ):

        def ready() -> bool:
            try:
                serving = set(client.models())
            except (GridError, KeyError, TypeError):
                serving = set()
            if want <= serving:
                return True
            try:
                status = client.status(detail=True)
            except GridError:
                status = {}
            failure = baseline_failure(status, want)
            if failure is not None:
                msg = f"the baseline did not start: {failure}; {_log_hint(root)}"
                raise UnavailableError(msg)
            spinner.update(f"  waiting for the baseline: {_residency_line(status, want)}")
            return False

        if wait_until_sync(ready, timeout_s=BASELINE_READY_S, interval_s=POLL_S * 2):
            echo(f"  baseline ready: {', '.join(sorted(want))}")
            return
    msg = (
        f"the baseline {sorted(want)} has no ready engine after {BASELINE_READY_S:.0f} s; "
        + _log_hint(root)
    )
    raise UnavailableError(msg)


def _residency_line(status: dict, want: set[str]) -> str:
    """``host:model:state`` for every residency of a model in ``want`` (progress text)."""
    ctl = status.get("controller") or {}
    parts = [
        f"{h.get('host_id')}:{r.get('model_id')}:{r.get('state')}"
        for h in ctl.get("hosts") or []
        for r in h.get("residencies") or []
        if r.get("model_id") in want
    ]
    return ", ".join(parts) or "no replica yet"


def baseline_failure(status: dict, want: set[str]) -> str | None:
    """The first failed load/warm of a model in ``want``, from an allocator status document.

    Returns:
        ``"<kind> of <model> on <host> failed: <message>"`` or ``None`` when nothing failed.
    """
    ctl = status.get("controller") or {}
    for key in ("history", "pending_commands"):
        for a in ctl.get(key) or ():
            if (
                isinstance(a, dict)
                and a.get("model_id") in want
                and a.get("kind") in ("load", "warm")
                and a.get("status") in ("failed", "rejected")
            ):
                why = a.get("message") or a.get("status")
                return f"{a['kind']} of {a['model_id']} on {a.get('host_id')} failed: {why}"
    for host in ctl.get("hosts") or ():
        for r in host.get("residencies") or ():
            if r.get("model_id") in want and r.get("state") == "failed":
                return f"{r['model_id']} on {host.get('host_id')} is in state failed"
    return None


def _log_hint(root: Path) -> str:
    """Where this run's logs are (they survive the stop; the next start clears them)."""
    hosts = sorted(d for d in (root / "hosts").glob("*") if d.is_dir())
    named = ", ".join(f"{d / 'agent.log'}, {d / 'logs'}/llama-*.log" for d in hosts)
    return f"logs of this run: {root / 'server.log'}" + (f", {named}" if named else "")


def _start_hosts(root: Path, url: str, hosts: tuple[HostSpec, ...], echo: Echo) -> None:
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        results = list(pool.map(lambda h: _start_host(root, url, h), hosts))
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


def stop(echo: Echo, root: Path | None = None) -> list[int]:
    """Drain and stop every host agent (and its engines), then the server.

    Returns:
        PIDs (agents, engines, server) that still run afterwards; empty when clean.
    """
    root = root or layout.fleet_dir()
    with exclusive(root):
        return _stop(echo, root)


def _stop(echo: Echo, root: Path) -> list[int]:
    rec = layout.load_record(root)
    if rec is None:
        echo("grid: no fleet here; nothing to stop")
        return []
    pids = _owned_pids(root, rec)
    _kill_switch(rec, root, echo)

    def stop_host(h: HostSpec) -> tuple[str, str]:
        sdir = root / "hosts" / h.host_id
        if not sdir.exists():
            return h.host_id, "no agent was started"
        agent = node_record(root, h.host_id)
        try:
            stop_node(sdir)
        except GridError as exc:
            return h.host_id, f"stop failed (exit {exc.exit_code}): {exc}"
        pid = f" pid {agent.pid}" if agent is not None and agent.pid else ""
        return h.host_id, f"agent{pid} drained and stopped with its engines"

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(rec.hosts)))) as pool:
        for hid, line in pool.map(stop_host, rec.hosts):
            echo(f"  {hid}: {line}")
    _stop_server(rec.server, echo)
    _stop_strays(root, echo)
    left = [pid for pid, birth in pids if not is_gone(pid) and same_birth(pid, birth)]
    left += [pid for pid in stray_processes(root) if pid not in left]
    if not left:
        layout.record_path(root).unlink(missing_ok=True)
    return left


def _kill_switch(rec: FleetRecord, root: Path, echo: Echo) -> None:
    """Put the allocator in ``recommend`` mode before draining anything.

    In automatic mode the controller would see the drained hosts' missing replicas and start
    new engines while the stop is under way; recommend mode stops all new commands first.
    """
    if server_proof(rec.server) != "proven" and not any(
        _is_server(p) for p in fleet_processes(root)
    ):
        return
    try:
        doc = _api(rec.url, root, Calls.set_mode("recommend"))
    except (GridError, OSError) as exc:
        echo(f"  could not switch the allocator to recommend mode ({exc}); stopping anyway")
        return
    echo(f"  allocator mode: {doc.get('mode', 'recommend')} (no new engines during the stop)")


def _owned_pids(root: Path, rec: FleetRecord) -> list[tuple[int, float | None]]:
    """Every (pid, birth) the fleet started: server, agents, engine children."""
    out: list[tuple[int, float | None]] = []
    if rec.server is not None:
        out.append((rec.server.pid, rec.server.birth))
    for h in rec.hosts:
        agent = node_record(root, h.host_id)
        if agent is not None and agent.pid:
            out.append((agent.pid, agent.birth))
        out.extend(engine_pids(root, h.host_id))
    return out


def engine_pids(root: Path, host_id: str) -> list[tuple[int, float | None]]:
    """Engine children recorded in a host's durable node state."""
    return engine_processes(root / "hosts" / host_id)


def status_document(root: Path | None = None) -> dict:
    """Fleet settings, processes and the server's allocator status (plain data)."""
    root = root or layout.fleet_dir()
    rec = layout.load_record(root)
    if rec is None:
        return {"running": False, "fleet_dir": str(root)}
    server = server_proof(rec.server)
    doc: dict = {
        "running": server == "proven",
        "fleet_dir": str(root),
        "url": rec.url,
        "token_file": str(token_path(root)),
        "settings": msgspec.to_builtins(rec.settings),
        "models": msgspec.to_builtins(rec.models),
        "hosts": [
            dict(msgspec.to_builtins(h), agent_running=node_running(root, h.host_id))
            for h in rec.hosts
        ],
        "server_pid": rec.server.pid if rec.server else None,
    }
    if server == "proven":
        try:
            with GridClient(rec.url, timeout=HTTP_TIMEOUT_S) as client:
                doc["allocator"] = client.status(detail=True)
        except GridError as exc:
            doc["allocator_error"] = f"{type(exc).__name__}: {exc}"
    return doc


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


def _stop_strays(root: Path, echo: Echo) -> None:
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


# --- restart --------------------------------------------------------------------------------
def restart(echo: Echo, root: Path | None = None) -> FleetRecord:
    """Bring back every fleet daemon that is not running, with its full configuration.

    The server is started exactly as ``grid test start`` started it (same port, the fleet's
    policy and tick interval, the same ``GRID_HOME``, so its durable controller state brings
    back profiles and mode); each host agent that is not running is started from its
    recorded host settings and credential (it adopts its own live engines). Daemons that run
    are left alone. Holds the fleet lock.

    Raises:
        ConflictError: no fleet was started here; or a server the record does not name runs
            on the fleet's home (``grid test stop`` stops it); or the recorded pid is alive but
            not provably the server.
        UnavailableError: the server or a host did not come back.
    """
    root = root or layout.fleet_dir()
    with exclusive(root), sigterm_as_interrupt():
        rec = layout.load_record(root)
        if rec is None:
            msg = f"no fleet was started in {root}; run 'grid test start'"
            raise ConflictError(msg)
        proof = server_proof(rec.server)
        if proof == "unproven":
            msg = (
                f"pid {rec.server.pid if rec.server else '?'} in {layout.record_path(root)} is "
                "alive but not provably the fleet server; inspect it by hand"
            )
            raise ConflictError(msg)
        if proof == "dead":
            others = [p for p in fleet_processes(root) if _is_server(p)]
            if others:
                msg = (
                    f"a fleet server the record does not name runs (pid {others[0].pid}); "
                    "run 'grid test stop' first"
                )
                raise ConflictError(msg)
            # The port the fleet actually got (a start with --port 0 picks a free one): the
            # agents and every client know the fleet by this URL.
            port = urlsplit(rec.url).port or rec.settings.port
            server, url = _start_server(root, port, fresh_log=False)
            rec.server = server
            if url != rec.url:
                echo(f"  note: the server now listens on {url} (was {rec.url})")
                rec.url = url
            layout.save_record(root, rec)
            echo(f"  server pid {server.pid} restarted on {url} (policy and state restored)")
        missing = tuple(h for h in rec.hosts if not node_running(root, h.host_id))
        if missing:
            _start_hosts(root, rec.url, missing, echo)
        else:
            echo("  every host agent is running")
        return rec


def _is_server(ident: ProcessIdentity) -> bool:
    cmd = ident.cmdline or ()
    return "grid_server.serve" in cmd or any(part.endswith("grid") for part in cmd[:2])
