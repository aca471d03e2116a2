"""Start a real server and FAKE engines on loopback as child processes (tests, bench, smoke).

Every process started here is stopped by :meth:`Child.stop` through its own PID (SIGTERM,
then SIGKILL after a grace period); nothing is ever signalled by name.
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import uvicorn

from grid_core.bodies import Registered
from grid_core.client import Call, GridClient
from grid_core.system import (
    SAFE_PATH_FLAG,
    SpawnedChild,
    StopOutcome,
    exit_status,
    scrubbed_env,
    spawn_detached,
    stop_process_sync,
    wait_until_sync,
    write_atomic,
)
from grid_core.wire import OPERATOR_HEADER, control_record_id, engine_record_id
from grid_server.context import NO_DELAY
from grid_server.home import OPERATOR_TOKEN_FILE, SERVER_FILE
from grid_server.proxy import Receive, Scope, Send

START_TIMEOUT_S = 30.0
"""Child start budget on a busy two-core machine (imports dominate)."""
START_POLL_S = 0.05
"""Seconds between checks for a child's announcement file."""
STOP_GRACE_S = 10.0
"""Graceful stop budget before SIGKILL."""


@dataclass
class Child:
    """A child process of this process and the URL it announced.

    Attributes:
        pid: the child's process id (our unreaped child: its own identity proof).
        url: what it announced.
        log: its stdout/stderr file.
        stopped: how :meth:`stop` ended it (``None`` until stopped).
    """

    pid: int
    url: str
    log: Path
    stopped: StopOutcome | None = None

    def stop(self) -> None:
        """Stop this child by PID: SIGTERM, then SIGKILL after :data:`STOP_GRACE_S` seconds.

        Blocking (tests and benchmarks call it from synchronous teardown code).
        """
        if self.stopped is None:
            self.stopped = stop_process_sync(SpawnedChild(self.pid), grace_s=STOP_GRACE_S)


def _wait_for_file(path: Path, pid: int, log: Path) -> str:
    def announced() -> str | None:
        if path.exists():
            return path.read_text()
        code = exit_status(pid)
        if code is not None:
            msg = f"child exited with {code}: {log.read_text()[-2000:]}"
            raise RuntimeError(msg)
        return None

    text = wait_until_sync(announced, timeout_s=START_TIMEOUT_S, interval_s=START_POLL_S)
    if text is None:
        stop_process_sync(SpawnedChild(pid), grace_s=0.0)
        msg = f"child did not announce itself within {START_TIMEOUT_S:.0f} s"
        raise RuntimeError(msg)
    return text


def _spawn(args: list[str], workdir: Path, name: str, env: dict[str, str]) -> tuple[int, Path]:
    log = workdir / f"{name}.log"
    # In our session: a developer's Ctrl-C reaches the children of an interrupted test run.
    pid = spawn_detached(args, log_path=log, env=env, truncate_log=True, new_session=False)
    return pid, log


def start_fake_engine(
    workdir: Path, model: str, api_key: str | None = None, *, prefix: Sequence[str] = ()
) -> tuple[Child, str]:
    """Start a FAKE engine for ``model``; returns the child and its API key.

    ``prefix`` runs it under a command prefix (``ip netns exec NS``: inside a namespace).
    """
    api_key = api_key or secrets.token_urlsafe(24)
    tag = secrets.token_hex(4)
    key_file = workdir / f"fake-{tag}.key"
    write_atomic(key_file, api_key)
    url_file = workdir / f"fake-{tag}.url"
    env = scrubbed_env()
    pid, log = _spawn(
        [
            *prefix,
            sys.executable,
            SAFE_PATH_FLAG,
            "-m",
            "grid_server.fake_engine",
            "--model",
            model,
            "--api-key-file",
            str(key_file),
            "--url-file",
            str(url_file),
        ],
        workdir,
        f"fake-{tag}",
        env,
    )
    return Child(pid, _wait_for_file(url_file, pid, log), log), api_key


def start_engine_front(
    workdir: Path,
    upstream: str,
    api_key: str,
    *,
    advertise_host: str,
    cert: Path,
    key: Path,
    ca: Path | None,
    prefix: Sequence[str] = (),
) -> Child:
    """Start a node's TLS engine front (``python -m grid_node.engine_tls``) as a child.

    Args:
        workdir: where its key file, URL file and log go.
        upstream: the loopback engine it relays to.
        api_key: the engine key it requires (written to an owner-only file, never argv).
        advertise_host / cert / key / ca: its address and TLS material.
        prefix: a command prefix, e.g. ``ip netns exec NS`` to run it in a namespace.
    """
    tag = secrets.token_hex(4)
    key_file = workdir / f"front-{tag}.key"
    write_atomic(key_file, api_key)
    url_file = workdir / f"front-{tag}.url"
    args = [
        *prefix,
        sys.executable,
        SAFE_PATH_FLAG,
        "-m",
        "grid_node.engine_tls",
        "--upstream",
        upstream,
        "--advertise-host",
        advertise_host,
        "--cert",
        str(cert),
        "--key",
        str(key),
        "--key-file",
        str(key_file),
        "--url-file",
        str(url_file),
    ]
    if ca is not None:
        args += ["--ca", str(ca)]
    pid, log = _spawn(args, workdir, f"front-{tag}", scrubbed_env())
    return Child(pid, _wait_for_file(url_file, pid, log), log)


ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class ThreadServer:
    """An ASGI app served by uvicorn on a loopback socket from a thread of this process.

    For FAKE engines in tests: the proxy reaches them over real HTTP, without the start-up
    cost of a Python process per engine. :meth:`stop` closes the socket, so a stopped engine
    refuses connections like a dead process does.
    """

    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        """Stop serving and wait for the thread (idempotent)."""
        self.server.should_exit = True
        self.thread.join(STOP_GRACE_S)


def serve_in_thread(app: ASGIApp, name: str) -> ThreadServer:
    """Serve ``app`` on a free loopback port from a daemon thread; returns once it listens.

    Raises:
        RuntimeError: the server did not start within :data:`START_TIMEOUT_S`.
    """
    from grid_server.serve import bind, url_of

    sock = bind("127.0.0.1", 0)
    config = uvicorn.Config(app, lifespan="off", access_log=False, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
    thread.start()
    url = url_of(sock)
    if (
        not wait_until_sync(
            lambda: server.started or not thread.is_alive(),
            timeout_s=START_TIMEOUT_S,
            interval_s=START_POLL_S,
        )
        or not server.started
    ):
        server.should_exit = True
        thread.join(STOP_GRACE_S)
        sock.close()
        msg = f"{name} did not start serving within {START_TIMEOUT_S:.0f} s"
        raise RuntimeError(msg)
    return ThreadServer(url, server, thread)


def fake_engine_in_thread(model: str, api_key: str | None = None) -> tuple[ThreadServer, str]:
    """A FAKE engine for ``model`` served from this process; returns it and its API key."""
    from grid_server.fake_engine import FakeEngine

    api_key = api_key or secrets.token_urlsafe(24)
    return serve_in_thread(FakeEngine(model, api_key), f"fake-engine-{model}"), api_key


def start_server(
    home: Path, tick_interval_s: float | None = None, extra_args: Sequence[str] = ()
) -> Child:
    """Start the real Grid server on a free loopback port with ``GRID_HOME=home``.

    ``extra_args`` go to ``python -m grid_server.serve`` (e.g. ``--tls-cert``/``--tls-key``,
    ``--host``).
    """
    home.mkdir(parents=True, exist_ok=True)
    url_file = home / "test-server.url"
    url_file.unlink(missing_ok=True)  # a restart in the same home must not read the old URL
    env = scrubbed_env(GRID_HOME=str(home))
    args = [
        sys.executable,
        SAFE_PATH_FLAG,
        "-m",
        "grid_server.serve",
        "--port",
        "0",
        "--url-file",
        str(url_file),
    ]
    if tick_interval_s is not None:
        args += ["--tick-interval", str(tick_interval_s)]
    args += list(extra_args)
    pid, log = _spawn(args, home, "server", env)
    raw = _wait_for_file(url_file, pid, log)
    return Child(pid, json.loads(raw)["url"], log)


@dataclass
class Testbed:
    """A server under test, driven the way nodes and operators drive it (tests, bench, smoke).

    Protocol calls go through the one typed client (:class:`grid_core.client.GridClient`);
    ``http`` stays available for hand-crafted requests (malformed bodies, missing headers).

    Attributes:
        url: the server's base URL.
        home: its ``GRID_HOME`` (the operator token is read from there).
        http: the httpx client to send through: a real one for a server process, Litestar's
            in-process test client for an in-process app.
    """

    __test__ = False  # a helper, not a test class: pytest must not try to collect it

    url: str
    home: Path
    http: httpx.Client = field(
        default_factory=lambda: httpx.Client(
            timeout=30.0, trust_env=False, transport=httpx.HTTPTransport(socket_options=NO_DELAY)
        )
    )

    @property
    def operator_token(self) -> str:
        """The operator capability the server created in its home."""
        return (self.home / OPERATOR_TOKEN_FILE).read_text().strip()

    @property
    def client(self) -> GridClient:
        """The typed client speaking with the operator capability."""
        return GridClient(self.url, operator_token=self.operator_token, http=self.http)

    def operator(self) -> dict[str, str]:
        """Headers carrying the operator capability (for hand-crafted requests)."""
        return {OPERATOR_HEADER: self.operator_token}

    def node(self, token: str) -> GridClient:
        """The typed client speaking as the host ``token`` is scoped to."""
        return GridClient(self.url, node_token=token, http=self.http)

    def node_token(self, host_id: str, ttl_s: float = 3600.0) -> str:
        """Issue a node credential through the operator API."""
        return self.client.issue_node_credential(host_id, ttl_s).token

    def register_host(
        self,
        token: str,
        host_id: str,
        capacity_mb: int = 16384,
        residencies: list[dict[str, object]] | None = None,
        state: str = "accepting",
        advertise_host: str | None = None,
    ) -> Registered:
        """PUT the host's control record (``state`` may be invalid on purpose).

        ``advertise_host``: the address every engine record of this host must use (``None``:
        its engines are on the server's loopback).

        Raises:
            RequestRefused: the server refused the record.
        """
        body: dict[str, object] = {
            "role": "allocator",
            "host_id": host_id,
            "resources": {"capacity_mb": capacity_mb, "runtimes": ["llama.cpp"]},
            "allocator": {
                "schema_version": 1,
                "state": state,
                "residencies": residencies or [],
                "actuator_capabilities": ["load", "warm", "drain", "unload"],
            },
        }
        if advertise_host is not None:
            body["advertise_host"] = advertise_host
        return self.register(token, control_record_id(host_id), body)

    def register_engine(
        self,
        token: str,
        host_id: str,
        model: str,
        url: str,
        api_key: str | None,
        ca_pem: str | None = None,
    ) -> Registered:
        """PUT one engine record for ``model`` on ``host_id`` (``ca_pem``: the CA an
        ``https://`` engine is verified with).

        Raises:
            RequestRefused: the server refused the record.
        """
        body: dict[str, object] = {
            "role": "engine",
            "host_id": host_id,
            "models": [model],
            "url": url,
        }
        if api_key:
            body["engine_api_key"] = api_key
        if ca_pem:
            body["engine_ca_pem"] = ca_pem
        return self.register(token, engine_record_id(host_id, model), body)

    def register(self, token: str, record_id: str, body: Mapping[str, object]) -> Registered:
        """PUT a registration given as plain JSON data (tests send invalid ones on purpose)."""
        call = Call("PUT", f"/nodes/{record_id}", Registered, msgspec.json.encode(body), "node")
        return self.node(token).send(call)

    def wait_ready(self, model: str, timeout_s: float = 10.0) -> None:
        """Wait until ``/v1/models`` lists ``model``.

        Raises:
            RuntimeError: not listed within ``timeout_s`` seconds.
        """

        def listed() -> bool:
            return model in self.client.models()

        if not wait_until_sync(listed, timeout_s=timeout_s, interval_s=START_POLL_S):
            msg = f"model {model} never became ready"
            raise RuntimeError(msg)

    def close(self) -> None:
        """Close the HTTP client."""
        self.http.close()


def server_url(home: Path) -> str | None:
    """URL recorded in ``home/server.json`` (None when no server runs there)."""
    try:
        return str(json.loads((home / SERVER_FILE).read_text())["url"])
    except (OSError, ValueError, KeyError):
        return None
