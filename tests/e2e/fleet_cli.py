"""Running the shipped ``grid`` CLI against a test's own GRID_HOME (e2e helper)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil

CLI_TIMEOUT_S = 900
"""Start waits for registration and the baseline on two shared cores."""


def grid(
    home: Path, *args: str, timeout: float = CLI_TIMEOUT_S, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``grid *args`` with ``GRID_HOME=home`` (plus ``extra_env``, which the daemons a
    ``grid test start`` launches inherit); output captured, exit code not checked."""
    env = dict(os.environ, **(extra_env or {}), GRID_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def owned(home: Path) -> list[psutil.Process]:
    """Processes whose command line names the fleet directory under ``home`` (this test's)."""
    marker = str(home / "fleet")
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or ()):
                out.append(p)
        except (psutil.Error, TypeError):
            continue
    return out


@contextmanager
def started_fleet(
    home: Path,
    *,
    machines: int,
    engine_port_base: int,
    capacities_gib: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> Iterator[tuple[Path, str, str]]:
    """Start a logical fleet with ``grid test start`` under ``home``; yield (fleet root, URL,
    operator token); stop it with ``grid test stop`` and prove from the process table that
    no fleet process is left, including one started by hand (found by its GRID_HOME).

    ``capacities_gib`` (``"3,3"``) sets each host's text capacity; the fleet's default
    otherwise. ``extra_env`` reaches the server and the node agents (e.g. the loopback
    artifact mirror ``GRID_HF_ENDPOINT``). The server binds a free port (``--port 0``)."""
    from grid_fleet import layout
    from grid_fleet.daemons import fleet_processes

    from grid_core.system import is_gone, same_birth

    sizes = ("--text-capacities-gib", capacities_gib) if capacities_gib else ()
    started = grid(
        home,
        "test",
        "start",
        "--machines",
        str(machines),
        *sizes,
        "--port",
        "0",
        "--engine-port-base",
        str(engine_port_base),
        extra_env=extra_env,
    )
    root = home / "fleet"
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        rec = layout.load_record(root)
        assert rec is not None
        token = (root / "server" / "operator-token").read_text().strip()
        yield root, rec.url, token
    finally:
        before = [(p.pid, p.birth) for p in fleet_processes(root)]
        before += [(p.pid, p.create_time()) for p in owned(home)]
        stopped = grid(home, "test", "stop")
        left = [pid for pid, born in before if same_birth(pid, born) and not is_gone(pid)]
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not left, f"processes left after 'grid test stop': {left}"
        assert not owned(home) and not fleet_processes(root)


def fleet_status(home: Path) -> dict:
    """``grid test status --json`` of the fleet under ``home`` (settings, hosts, models, URL)."""
    import json

    done = grid(home, "test", "status", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def cli(
    env: dict[str, str], *args: str, timeout: float = 300.0
) -> subprocess.CompletedProcess[str]:
    """Run ``grid *args`` with exactly ``env`` (a node agent's own GRID_HOME, no credentials
    inherited); output captured, exit code not checked."""
    return subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def wait_for(predicate, what: str, timeout_s: float = 240.0):  # type: ignore[no-untyped-def]
    """The first truthy value of ``predicate`` within ``timeout_s`` (polled every 0.5 s; the
    default bounds one convergence step on a busy 2-core machine, never asserted as a time).

    Raises:
        AssertionError: naming ``what`` when the deadline passes.
    """
    from grid_core.system import wait_until_sync

    value = wait_until_sync(predicate, timeout_s=timeout_s, interval_s=0.5)
    if not value:
        raise AssertionError(f"timed out waiting for {what}")
    return value


def write_node_token(path: Path, host_id: str, token: str) -> Path:
    """Write a node credential file as ``grid allocator token write`` does (0600)."""
    import json

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"host_id": host_id, "token": token}, f)
    return path


def default_sigint() -> None:
    """``preexec_fn`` for a CLI child the test will press Ctrl-C on.

    A shell that starts the suite in the background, and pytest-xdist's workers, leave SIGINT
    ignored, and Python keeps an inherited "ignore": without this the child never sees the
    Ctrl-C the test sends (as a terminal would deliver it to a user's command).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class FleetApi:
    """A running fleet's server as an operator (status, profiles, actions) sees it over HTTP.

    ``max_connections`` bounds the shared client's pool (a test with many concurrent clients
    raises it). Tests add what they send as users (chat) in a subclass.
    """

    def __init__(
        self, home: Path, url: str, token: str, *, max_connections: int | None = None
    ) -> None:
        self.home, self.url, self.token = home, url, token
        limits = httpx.Limits(max_connections=max_connections) if max_connections else None
        self.http = httpx.Client(
            timeout=120.0, trust_env=False, **({"limits": limits} if limits else {})
        )
        self.ops = {"x-grid-allocator-token": token}

    def controller(self) -> dict[str, Any]:
        """The status's ``controller`` document; ``{}`` while the server cannot answer."""
        try:
            r = self.http.get(
                self.url + "/allocator/status", params={"detail": "1"}, headers=self.ops
            )
            return (r.json().get("controller") or {}) if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def profile(self, model: str) -> dict[str, Any] | None:
        """The model's profile, or ``None`` when it has none yet."""
        r = self.http.get(f"{self.url}/allocator/models/{model}")
        if r.status_code == 404:
            return None
        assert r.status_code == 200, r.text
        prof: dict[str, Any] = r.json()["profile"]
        return prof

    def put_profile(self, model: str, fields: dict[str, object]) -> None:
        """Change (or create) the model's profile with ``fields``, as the operator."""
        prof = {**(self.profile(model) or {"model_id": model}), **fields}
        put = self.http.put(f"{self.url}/allocator/models/{model}", json=prof, headers=self.ops)
        assert put.status_code == 200, put.text

    def actions(self, since: float) -> list[dict[str, Any]]:
        """Every action (finished or pending) created at or after ``since`` (Unix s)."""
        ctl = self.controller()
        rows = {a["action_id"]: a for a in ctl.get("history") or []}
        rows.update({a["action_id"]: a for a in ctl.get("pending_commands") or []})
        return sorted(
            (a for a in rows.values() if a["created_at"] >= since), key=lambda a: a["created_at"]
        )

    def placement(self) -> dict[str, set[str]]:
        """host → models holding memory there (anything but cached)."""
        return {
            h["host_id"]: {
                r["model_id"] for r in h.get("residencies") or [] if r["state"] != "cached"
            }
            for h in self.controller().get("hosts") or []
        }


ANSWER_TOKENS = 8
"""Tokens of an ordinary chat reply in the fleet tests (``ignore_eos``: exactly this many)."""
RETRY_POLL_S = 0.5
"""A cold client's resend interval after a 503."""
CONVERGE_S = 240.0
"""Upper bound for one convergence on a loaded 2-core machine (bounds a wait, never timed)."""


class ChatFleet(FleetApi):
    """:class:`FleetApi` plus what a client sends: chat requests, resent while the grid
    answers 503, and which hosts report a model ready."""

    def chat(self, model: str, text: str, max_tokens: int = ANSWER_TOKENS) -> tuple[int, str]:
        """One request; (status, the answering model from the body or the error code; the
        exception's name and status 0 when the connection failed)."""
        body = {
            "model": model,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": text}],
        }
        try:
            r = self.http.post(self.url + "/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            return 0, type(exc).__name__
        doc = r.json()
        if r.status_code == 200:
            assert doc["choices"][0]["message"]["content"] is not None, doc
            return 200, doc["model"]
        return r.status_code, (doc.get("error") or {}).get("code", "")

    def answered(self, model: str, text: str) -> str:
        """Resend every :data:`RETRY_POLL_S` while the grid answers 503 (at most
        :data:`CONVERGE_S`); the answering model."""
        import time

        deadline = time.monotonic() + CONVERGE_S
        while True:
            code, who = self.chat(model, text)
            if code == 200:
                return who
            assert code == 503, (code, who)
            assert time.monotonic() < deadline, f"{model} still 503 after {CONVERGE_S} s"
            time.sleep(RETRY_POLL_S)

    def ready_on(self, model: str) -> list[str]:
        """Hosts a node reports ``model`` ready on, sorted."""
        return sorted(
            str(h["host_id"])
            for h in self.controller().get("hosts") or []
            if any(r["model_id"] == model and r["state"] == "ready" for r in h["residencies"])
        )

    def burst(
        self, model: str, prompt: str, clients: int, seconds: float, max_tokens: int
    ) -> Counter[tuple[int, str]]:
        """``clients`` concurrent clients, each sending ``prompt`` (``{i}``: the client's
        number) for ``model`` again and again for ``seconds``; every answer counted as
        (status, answering model or error code)."""
        import threading
        import time
        from concurrent.futures import ThreadPoolExecutor

        answers: Counter[tuple[int, str]] = Counter()
        lock = threading.Lock()

        def client(i: int) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                got = self.chat(model, prompt.format(i=i), max_tokens)
                with lock:
                    answers[got] += 1

        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(client, range(clients)))
        return answers


ChatFleetT = TypeVar("ChatFleetT", bound=ChatFleet)
"""A test module's own :class:`ChatFleet` subclass."""


@contextmanager
def chat_fleet(
    kind: type[ChatFleetT], home: Path, *, machines: int, engine_port_base: int, gib: int
) -> Iterator[ChatFleetT]:
    """A logical fleet of ``machines`` hosts of ``gib`` GiB each (:func:`started_fleet`), seen
    through a ``kind`` client whose connections are closed at the end."""
    with started_fleet(
        home,
        machines=machines,
        engine_port_base=engine_port_base,
        capacities_gib=",".join([str(gib)] * machines),
    ) as (_root, url, token):
        f = kind(home, url, token)
        try:
            yield f
        finally:
            f.http.close()
