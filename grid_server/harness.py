"""Start a real server and FAKE engines on loopback as child processes (tests, bench, smoke).

Every process started here is stopped by :meth:`Child.stop` through its own PID (SIGTERM,
then SIGKILL after a grace period); nothing is ever signalled by name.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from grid_core.wire import CONTROL_HEADER, OPERATOR_HEADER, control_record_id, engine_record_id
from grid_server.context import NO_DELAY
from grid_server.home import OPERATOR_TOKEN_FILE, SERVER_FILE

START_TIMEOUT_S = 30.0
"""Child start budget on a busy two-core machine (imports dominate)."""
STOP_GRACE_S = 10.0
"""Graceful stop budget before SIGKILL."""


@dataclass
class Child:
    """A child process and the URL it announced."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        """Stop this child by PID: SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_GRACE_S)


def _wait_for_file(path: Path, proc: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        if proc.poll() is not None:
            msg = f"child exited with {proc.returncode}: {log.read_text()[-2000:]}"
            raise RuntimeError(msg)
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    msg = f"child did not announce itself within {START_TIMEOUT_S:.0f} s"
    raise RuntimeError(msg)


def _spawn(
    args: list[str], workdir: Path, name: str, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], Path]:
    log = workdir / f"{name}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, env=env, close_fds=True
        )
    return proc, log


def start_fake_engine(workdir: Path, model: str, api_key: str | None = None) -> tuple[Child, str]:
    """Start a FAKE engine for ``model``; returns the child and its API key."""
    api_key = api_key or secrets.token_urlsafe(24)
    tag = secrets.token_hex(4)
    key_file = workdir / f"fake-{tag}.key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, api_key.encode())
    os.close(fd)
    url_file = workdir / f"fake-{tag}.url"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_ALLOCATOR")}
    proc, log = _spawn(
        [
            sys.executable,
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
    return Child(proc, _wait_for_file(url_file, proc, log), log), api_key


def start_server(home: Path, tick_interval_s: float | None = None) -> Child:
    """Start the real Grid server on a free loopback port with ``GRID_HOME=home``."""
    home.mkdir(parents=True, exist_ok=True)
    url_file = home / "test-server.url"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_ALLOCATOR")}
    env["GRID_HOME"] = str(home)
    args = [sys.executable, "-m", "grid_server.serve", "--port", "0", "--url-file", str(url_file)]
    if tick_interval_s is not None:
        args += ["--tick-interval", str(tick_interval_s)]
    proc, log = _spawn(args, home, "server", env)
    raw = _wait_for_file(url_file, proc, log)
    return Child(proc, json.loads(raw)["url"], log)


@dataclass
class GridClient:
    """Test/bench helper speaking the node and operator protocols to one server."""

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

    def operator(self) -> dict[str, str]:
        """Headers carrying the operator capability."""
        return {OPERATOR_HEADER: self.operator_token}

    def node_token(self, host_id: str, ttl_s: float = 3600.0) -> str:
        """Issue a node credential through the operator API."""
        r = self.http.post(
            self.url + "/allocator/tokens",
            headers=self.operator(),
            json={"host_id": host_id, "ttl_s": ttl_s},
        )
        r.raise_for_status()
        return str(r.json()["token"])

    def register_host(
        self,
        token: str,
        host_id: str,
        capacity_mb: int = 16384,
        residencies: list[dict[str, object]] | None = None,
        state: str = "accepting",
    ) -> httpx.Response:
        """PUT the host's control record."""
        body = {
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
        return self.http.put(
            f"{self.url}/nodes/{control_record_id(host_id)}",
            json=body,
            headers={CONTROL_HEADER: token},
        )

    def register_engine(
        self, token: str, host_id: str, model: str, url: str, api_key: str | None
    ) -> httpx.Response:
        """PUT one engine record for ``model`` on ``host_id``."""
        body: dict[str, object] = {
            "role": "engine",
            "host_id": host_id,
            "models": [model],
            "url": url,
        }
        if api_key:
            body["engine_api_key"] = api_key
        return self.http.put(
            f"{self.url}/nodes/{engine_record_id(host_id, model)}",
            json=body,
            headers={CONTROL_HEADER: token},
        )

    def wait_ready(self, model: str, timeout_s: float = 10.0) -> None:
        """Wait until ``/v1/models`` lists ``model``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ids = [m["id"] for m in self.http.get(self.url + "/v1/models").json()["data"]]
            if model in ids:
                return
            time.sleep(0.05)
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
