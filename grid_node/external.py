"""External inventory: an engine Grid does not own, joined by URL (``grid join --at``).

An operator points Grid at an already-running OpenAI-compatible engine (a vLLM, Ollama,
llama.cpp or any OpenAI-style server) that something else started. Grid only *routes* to it
and counts it as inventory of its runtime kind: it never starts, drains or stops it
(specification, "Safety invariants" 7 and "Current limits": lifecycle authority never follows
from protocol detection alone).

A small detached keeper process per joined engine holds two registry records on the Grid
server — a control record whose one residency is ``ownership: external`` with the engine's
runtime kind and no actuator capabilities, and the engine's route — and refreshes them while
the engine lists the model. When the engine stops answering, the route is withdrawn; when
the operator runs ``grid join --remove NAME``, the keeper is stopped by proven identity and
both records are removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import httpx
import msgspec

from grid_core.client import AsyncGridClient, Calls, GridClient, RequestRefused
from grid_core.errors import GridError, NotFoundError, ValidationError
from grid_core.system import (
    SAFE_PATH_FLAG,
    ProcessIdentity,
    birth_of,
    grid_home,
    spawn_detached,
    stop_process_sync,
    write_atomic,
)
from grid_core.wire import (
    AllocatorEnvelope,
    Heartbeat,
    NodeRegistration,
    Residency,
    Resources,
    control_record_id,
    engine_record_id,
)

Kind = Literal["vllm", "ollama", "llama.cpp", "openai"]
KINDS: tuple[str, ...] = ("vllm", "ollama", "llama.cpp", "openai")
REFRESH_S = 5.0
"""Seconds between refreshes: well inside the server's 60 s record lease."""
PROBE_TIMEOUT_S = 5.0
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
"""Names of joined engines (also part of the external host id)."""
STOP_GRACE_S = 10.0


class ExternalEngine(msgspec.Struct, frozen=True, kw_only=True):
    """One joined engine, as ``$GRID_HOME/external/<name>.json`` (0600) records it.

    Attributes:
        name: the operator's name for it (``grid join --remove NAME``).
        url: the engine's base URL (its ``/v1`` routes live under it).
        model: the model id it serves.
        kind: its runtime kind (vllm, ollama, llama.cpp, openai).
        grid_url: the Grid server.
        api_key_file: file holding the engine's own API key, if it needs one.
    """

    name: str
    url: str
    model: str
    kind: str
    grid_url: str
    api_key_file: str | None = None

    @property
    def host_id(self) -> str:
        """The external host id its records are filed under."""
        return f"external-{self.name}"

    def api_key(self) -> str | None:
        """The engine's key from its file (never stored in the record itself)."""
        if self.api_key_file is None:
            return None
        return Path(self.api_key_file).read_text().strip() or None


def external_dir() -> Path:
    """Where joined engines and their keepers are recorded."""
    return grid_home() / "external"


def probe(engine: ExternalEngine) -> bool:
    """Whether the engine's ``/v1/models`` lists the model."""
    key = engine.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.get(
            f"{engine.url}/v1/models", headers=headers, timeout=PROBE_TIMEOUT_S, trust_env=False
        )
        ids = {m.get("id") for m in r.json().get("data", [])} if r.status_code == 200 else set()
    except (httpx.HTTPError, ValueError, AttributeError):
        return False
    return engine.model in ids


def check(name: str, url: str, kind: str) -> None:
    """Refuse a malformed join before anything is recorded.

    Raises:
        ValidationError: the name, URL or kind is malformed (the field is named).
    """
    if not NAME.match(name):
        msg = f"--name {name!r}: use lowercase letters, digits, . _ - (at most 63)"
        raise ValidationError(msg)
    if not re.match(r"^https?://[^/\s]+$", url.rstrip("/")):
        msg = f"--at {url!r}: use the engine's base URL, e.g. http://10.0.0.7:8000"
        raise ValidationError(msg)
    if kind not in KINDS:
        msg = f"--kind {kind!r}: use one of {', '.join(KINDS)}"
        raise ValidationError(msg)


def _registrations(engine: ExternalEngine, healthy: bool) -> tuple[NodeRegistration, ...]:
    residency = Residency(
        model_id=engine.model,
        memory_mb=0,
        state="ready" if healthy else "failed",
        managed=False,
        ownership="external",
        runtime=engine.kind,
        route_url=engine.url if healthy else None,
    )
    control = NodeRegistration(
        role="allocator",
        host_id=engine.host_id,
        advertise_host=urlsplit(engine.url).hostname,  # the engine's machine is this "node"
        resources=Resources(capacity_mb=0, runtimes=[engine.kind]),
        allocator=AllocatorEnvelope(
            state="accepting", residencies=[residency], actuator_capabilities=[]
        ),
    )
    if not healthy:
        return (control,)
    route = NodeRegistration(
        role="engine",
        host_id=engine.host_id,
        models=[engine.model],
        url=engine.url,
        engine_api_key=engine.api_key(),
    )
    return (control, route)


async def keep(engine: ExternalEngine, token: str, stop: asyncio.Event) -> None:
    """Refresh the records every :data:`REFRESH_S` seconds until ``stop`` is set."""
    client = AsyncGridClient(engine.grid_url, node_token=token)
    ctl_id = control_record_id(engine.host_id)
    eng_id = engine_record_id(engine.host_id, engine.model)
    routed = False
    try:
        while not stop.is_set():
            healthy = await asyncio.to_thread(probe, engine)
            with contextlib.suppress(GridError):
                for reg in _registrations(engine, healthy):
                    rid = ctl_id if reg.role == "allocator" else eng_id
                    await client.send(Calls.register(rid, reg))
                if routed and not healthy:
                    with contextlib.suppress(RequestRefused):
                        await client.send(Calls.remove(eng_id))
                routed = healthy
                hb = Heartbeat(node_id=ctl_id, host_id=engine.host_id, request_commands=False)
                await client.send(Calls.heartbeat(ctl_id, hb))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), REFRESH_S)
    finally:
        for rid in (eng_id, ctl_id):
            with contextlib.suppress(GridError):
                await client.send(Calls.remove(rid))
        await client.aclose()


def mint_token(grid_url: str, host_id: str) -> str:
    """A host-scoped credential for the external host, minted with the local operator token.

    Raises:
        NotFoundError: no operator token on this machine.
    """
    path = grid_home() / "operator-token"
    try:
        operator = path.read_text().strip()
    except OSError:
        msg = f"no operator token at {path}: run grid join on the Grid's own machine"
        raise NotFoundError(msg) from None
    with GridClient(grid_url, operator_token=operator) as client:
        return client.issue_node_credential(host_id).token


def join(engine: ExternalEngine) -> int:
    """Record the engine and start its keeper; returns the keeper's PID.

    Raises:
        ValidationError: the engine does not list the model (nothing is recorded).
        NotFoundError: no operator token to mint the credential with.
    """
    if not probe(engine):
        msg = (
            f"{engine.url}/v1/models does not list {engine.model!r}; check --at, -m and the "
            "engine's key (--api-key-file)"
        )
        raise ValidationError(msg)
    token = mint_token(engine.grid_url, engine.host_id)
    d = external_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(d / f"{engine.name}.json", msgspec.json.encode(engine))
    write_atomic(d / f"{engine.name}.token", token)
    argv = [sys.executable, SAFE_PATH_FLAG, "-m", "grid_node.external", "--keep", engine.name]
    pid = spawn_detached(argv, log_path=d / f"{engine.name}.log", truncate_log=True)
    record = {"pid": pid, "birth": birth_of(pid), "argv": argv}
    write_atomic(d / f"{engine.name}.keeper.json", json.dumps(record))
    return pid


def remove(name: str) -> str:
    """Stop the keeper of ``name`` (by proven identity) so its records leave the Grid.

    Raises:
        NotFoundError: nothing was joined under ``name``.
    """
    d = external_dir()
    rec_path = d / f"{name}.keeper.json"
    if not (d / f"{name}.json").exists():
        joined = sorted(p.stem for p in d.glob("*.json") if not p.stem.endswith(".keeper"))
        msg = f"no joined engine named {name!r} (joined: {', '.join(joined) or 'none'})"
        raise NotFoundError(msg)
    outcome = "keeper not running"
    with contextlib.suppress(FileNotFoundError, ValueError):
        rec = json.loads(rec_path.read_text())
        ident = ProcessIdentity(rec["pid"], rec["birth"], cmdline=tuple(rec["argv"]))
        outcome = stop_process_sync(ident, grace_s=STOP_GRACE_S)
    for suffix in (".json", ".token", ".keeper.json"):
        (d / f"{name}{suffix}").unlink(missing_ok=True)
    return f"removed {name} ({outcome})"


def _keep_main(name: str) -> int:
    d = external_dir()
    engine = msgspec.json.decode((d / f"{name}.json").read_bytes(), type=ExternalEngine)
    token = (d / f"{name}.token").read_text().strip()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await keep(engine, token, stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--keep":
        sys.exit(_keep_main(sys.argv[2]))
    print("usage: python -m grid_node.external --keep NAME", file=sys.stderr)
    sys.exit(2)
