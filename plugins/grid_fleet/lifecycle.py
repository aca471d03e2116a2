"""Start, stop and restart the logical fleet: one real server, N real node agents, engines.

The daemons themselves (server, host agents, the fleet's processes) are started and found by
:mod:`grid_fleet.daemons`, the models prepared by :mod:`grid_fleet.models`; this module
composes them under the fleet lock, with the baseline wait and the status document. Source:
the specification's "Single-machine scenario lab and logical fleet test" and "CLI workflow"
(token write, node start/stop). The fleet drives the shipped pieces as an operator would:
``python -m grid_server.serve`` for the API, ``POST /allocator/tokens`` + an owner-only file
for each host credential, the node launcher of the public plugin API (the one behind
``grid allocator node start/stop``: one configuration document per logical host) and
``PUT /allocator/models/…`` / ``PUT /allocator/mode`` through the typed client.

Processes are only ever signalled after an identity proof (PID + birth time + a command-line
marker); node agents and their engine children are stopped by the node's own graceful stop.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

from grid_core.api import (
    Calls,
    ConflictError,
    GridClient,
    GridEntry,
    GridError,
    SettingsConflictError,
    UnavailableError,
    is_gone,
    register_grid,
    same_birth,
    unregister_grid,
    wait_until_sync,
)
from grid_fleet import layout, media
from grid_fleet.daemons import (
    HTTP_TIMEOUT_S,
    POLL_S,
    api,
    fleet_processes,
    is_server,
    node_launcher,
    node_processes,
    node_running,
    owned_pids,
    server_proof,
    start_hosts,
    start_server,
    stop_server,
    stop_strays,
    stray_processes,
    token_path,
)
from grid_fleet.layout import (
    FLEET_GRID_NAME,
    FleetRecord,
    FleetSettings,
    HostSpec,
    ModelSpec,
)
from grid_fleet.models import check_gguf, prepare_models

BASELINE_READY_S = 120.0
"""Start waits this long for the baseline replica: a tiny model warms in seconds."""
LOCK_FILE = "fleet.lock"
"""Exclusive lock held by ``grid test start``/``stop`` (one fleet operation at a time)."""

Echo = Callable[[str], None]


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
def start(
    settings: FleetSettings,
    echo: Echo,
    root: Path | None = None,
    *,
    capacities_given: bool = True,
) -> FleetRecord:
    """Start (or confirm) the fleet described by ``settings``.

    Idempotent: a running fleet with identical settings is reused (missing host agents are
    restarted); different settings are refused naming each differing flag the operator gave
    (``capacities_given=False``: ``settings.capacities_mb`` is an equal split derived from
    ``--machines``, not asked for; see :func:`grid_fleet.layout.settings_conflicts`). Holds
    the fleet lock throughout; SIGTERM is handled like Ctrl-C.

    Raises:
        SettingsConflictError: a fleet with other settings runs here (exit 2).
        ConflictError: another start/stop is running on this GRID_HOME.
        ValidationError: an operator ``--model`` is not a readable GGUF.
        UnavailableError: the server or a host did not come up, or the baseline failed
            (everything started by this call is stopped again before raising).
        Terminated: SIGTERM arrived (everything started by this call is stopped first).
    """
    root = root or layout.fleet_dir()
    for raw in settings.models:
        check_gguf(Path(raw))
    with exclusive(root), sigterm_as_interrupt():
        return _start(settings, echo, root, capacities_given=capacities_given)


def settings_conflict(
    running: FleetSettings,
    asked: FleetSettings,
    *,
    capacities_given: bool = True,
    machines_given: bool = True,
) -> SettingsConflictError:
    """The refusal of a start whose settings differ from the running fleet's: it names each
    differing flag with both values (:func:`grid_fleet.layout.settings_conflicts`, which
    also explains the two keywords) and the fix (exit 2)."""
    diff = layout.settings_conflicts(
        running, asked, capacities_given=capacities_given, machines_given=machines_given
    )
    msg = "a fleet with different settings is running (" + "; ".join(diff)
    return SettingsConflictError(msg + "); run 'grid test stop' first")


def _start(
    settings: FleetSettings, echo: Echo, root: Path, *, capacities_given: bool
) -> FleetRecord:
    existing = layout.load_record(root)
    if existing is not None and server_proof(existing.server) == "proven":
        if existing.settings != settings:
            raise settings_conflict(existing.settings, settings, capacities_given=capacities_given)
        missing = [h for h in existing.hosts if not node_running(root, h.host_id)]
        if not missing:
            echo(f"grid: the fleet is already running at {existing.url} (same settings)")
            return existing
        echo(f"grid: restarting {len(missing)} stopped host agent(s)")
        start_hosts(root, existing.url, tuple(missing), echo)
        return existing
    if existing is not None and server_proof(existing.server) == "unproven":
        msg = (
            f"pid {existing.server.pid if existing.server else '?'} in "
            f"{layout.record_path(root)} is alive but not provably the fleet server; "
            "inspect it by hand"
        )
        raise ConflictError(msg)
    hosts = layout.host_specs(
        settings.capacities_mb, settings.engine_port_base, media=settings.include_comfyui
    )
    _fresh(root)
    echo(f"grid: starting a logical fleet of {settings.machines} host(s) in {root}")
    models = prepare_models(root, settings, echo)
    server, url = start_server(root, settings.port)
    rec = FleetRecord(
        settings=settings,
        url=url,
        hosts=hosts,
        models=models,
        server=server,
        started_at=time.time(),
    )
    layout.save_record(root, rec)
    try:
        echo(f"  server pid {server.pid} on {url}")
        _name_grid(root, url, echo)
        for m in models:
            api(url, root, Calls.put_model(m.model_id, layout.profile_document(m)))
            echo(
                f"  profile {m.model_id}: {m.memory_mb} MB, priority {m.priority}, "
                f"replicas {m.min_replicas}..{m.max_replicas}"
            )
        if settings.include_comfyui:
            media.start_media(root, rec, _put_profile(url, root), echo)
        start_hosts(root, url, hosts, echo)
        mode = api(url, root, Calls.set_mode("automatic"))
        if mode.get("mode") != "automatic":
            msg = f"the server refused automatic mode: {mode}"
            raise UnavailableError(msg)
        _wait_baseline(url, root, models, echo)
    except BaseException:
        quiet = _quiet(echo)
        quiet("grid: start failed; stopping what was started")
        _stop(quiet, root)
        raise
    return rec


def _quiet(echo: Echo) -> Echo:
    """``echo`` that drops a line it cannot write (OSError: the reader of a pipe went away,
    as in ``grid test start | head``): the clean-up after a failed start must run to its end
    even when its output has nowhere to go."""

    def say(line: str) -> None:
        with suppress(OSError):
            echo(line)

    return say


FLEET_START_HINT = "grid test restart"


def _name_grid(root: Path, url: str, echo: Echo) -> None:
    """Register the fleet as the named grid :data:`FLEET_GRID_NAME` (best effort: a grids
    file the operator broke by hand costs only the convenience, so it is reported, not
    fatal)."""
    entry = GridEntry(url=url, token_file=str(token_path(root)), start_hint=FLEET_START_HINT)
    try:
        register_grid(FLEET_GRID_NAME, entry)
    except GridError as exc:
        echo(f"  could not name the fleet grid {FLEET_GRID_NAME!r}: {exc}")
        return
    echo(f"  named grid {FLEET_GRID_NAME!r}: --grid {FLEET_GRID_NAME} (or {url}) uses its token")


def _put_profile(url: str, root: Path) -> Callable[[ModelSpec], None]:
    """Register one model's placement profile on the fleet server."""

    def put(m: ModelSpec) -> None:
        api(url, root, Calls.put_model(m.model_id, layout.profile_document(m)))

    return put


def _fresh(root: Path) -> None:
    """Forget a stopped fleet's controller and node state (a new start is a new fleet).

    Old node state would carry the previous controller's term and receipts, and old
    controller state a restart grace; the operator token, signing key and models stay. A
    ``grid test compete`` journal goes with the profiles it describes: left in place, status
    would warn about edits the new fleet does not have, and the next compete would fail
    trying to undo them.

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
    (root / layout.COMPETE_JOURNAL).unlink(missing_ok=True)


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
    pids = owned_pids(root, rec)
    _kill_switch(rec, root, echo)

    launcher = node_launcher()  # loads the plugins once, before the worker threads

    def stop_host(h: HostSpec) -> tuple[str, str]:
        sdir = root / "hosts" / h.host_id
        if not sdir.exists():
            return h.host_id, "no agent was started"
        agent = node_processes(root, h.host_id)
        try:
            launcher.stop(sdir)
        except GridError as exc:
            return h.host_id, f"stop failed (exit {exc.exit_code}): {exc}"
        pid = f" pid {agent.agent_pid}" if agent.agent_pid else ""
        return h.host_id, f"agent{pid} drained and stopped with its engines"

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(rec.hosts)))) as pool:
        for hid, line in pool.map(stop_host, rec.hosts):
            echo(f"  {hid}: {line}")
    # After the media node unloaded its workflows (its gateways talk to ComfyUI).
    media.stop_comfyui(rec.comfyui, echo)
    stop_server(rec.server, echo)
    stop_strays(root, echo)
    left = [pid for pid, birth in pids if not is_gone(pid) and same_birth(pid, birth)]
    left += [pid for pid in stray_processes(root) if pid not in left]
    if not left:
        layout.record_path(root).unlink(missing_ok=True)
        try:
            unregister_grid(FLEET_GRID_NAME, rec.url)
        except GridError as exc:
            echo(f"  could not remove the named grid {FLEET_GRID_NAME!r}: {exc}")
    return left


def _kill_switch(rec: FleetRecord, root: Path, echo: Echo) -> None:
    """Put the allocator in ``recommend`` mode before draining anything.

    In automatic mode the controller would see the drained hosts' missing replicas and start
    new engines while the stop is under way; recommend mode stops all new commands first.
    """
    if server_proof(rec.server) != "proven" and not any(
        is_server(p) for p in fleet_processes(root)
    ):
        return
    try:
        doc = api(rec.url, root, Calls.set_mode("recommend"))
    except (GridError, OSError) as exc:
        echo(f"  could not switch the allocator to recommend mode ({exc}); stopping anyway")
        return
    echo(f"  allocator mode: {doc.get('mode', 'recommend')} (no new engines during the stop)")


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
        "compete_edits": compete_edits(root),
    }
    if server == "proven":
        try:
            with GridClient(rec.url, timeout=HTTP_TIMEOUT_S) as client:
                doc["allocator"] = client.status(detail=True)
        except GridError as exc:
            doc["allocator_error"] = f"{type(exc).__name__}: {exc}"
    return doc


def compete_edits(root: Path) -> list[str]:
    """The models whose profiles carry a ``grid test compete`` temporary edit (sorted; empty
    without a journal). An unreadable journal is reported as one entry saying so."""
    journal = root / layout.COMPETE_JOURNAL
    try:
        doc = msgspec.json.decode(journal.read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, msgspec.DecodeError):
        return [f"(unreadable journal {journal})"]
    return sorted(doc) if isinstance(doc, dict) else [f"(unreadable journal {journal})"]


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
            others = [p for p in fleet_processes(root) if is_server(p)]
            if others:
                msg = (
                    f"a fleet server the record does not name runs (pid {others[0].pid}); "
                    "run 'grid test stop' first"
                )
                raise ConflictError(msg)
            # The port the fleet actually got (a start with --port 0 picks a free one): the
            # agents and every client know the fleet by this URL.
            port = urlsplit(rec.url).port or rec.settings.port
            server, url = start_server(root, port, fresh_log=False)
            rec.server = server
            if url != rec.url:
                echo(f"  note: the server now listens on {url} (was {rec.url})")
                rec.url = url
            layout.save_record(root, rec)
            echo(f"  server pid {server.pid} restarted on {url} (policy and state restored)")
        media.restart_comfyui(root, rec, echo)
        missing = tuple(h for h in rec.hosts if not node_running(root, h.host_id))
        if missing:
            start_hosts(root, rec.url, missing, echo)
        else:
            echo("  every host agent is running")
        return rec
