"""Helpers for server integration tests: FAKE engine handles and node registration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from grid_core.wire import control_record_id
from grid_server.harness import Child, Testbed, ThreadServer


@dataclass
class Engine:
    """A running FAKE engine and its key (``child.stop()`` makes it unreachable)."""

    child: ThreadServer
    key: str
    model: str

    @property
    def url(self) -> str:
        return self.child.url

    def behave(self, **cfg: object) -> None:
        """Configure the fake's next responses (status, count, delay_ms, tokens)."""
        r = httpx.post(
            self.url + "/fake/behaviour",
            json=cfg,
            headers={"authorization": f"Bearer {self.key}"},
            trust_env=False,
        )
        r.raise_for_status()

    def stats(self) -> dict[str, Any]:
        """The fake's counters: ``requests`` by path, ``cancelled_at``, ``max_active``."""
        r = httpx.get(
            self.url + "/fake/stats",
            headers={"authorization": f"Bearer {self.key}"},
            trust_env=False,
        )
        r.raise_for_status()
        doc: dict[str, Any] = r.json()
        return doc

    def requests(self) -> int:
        """POSTs this engine has received on the inference endpoints."""
        return sum(self.stats()["requests"].values())


@dataclass
class Grid(Testbed):
    """The server under test plus the protocol helpers of :class:`Testbed`.

    In process (``child`` is None) unless the test exercises a process lifecycle or the
    server's own log; then ``child`` is the real server process.
    """

    child: Child | None = None

    def log_text(self) -> str:
        """The server process's log (only for a server started as a process)."""
        assert self.child is not None, "this test needs the server as a process (grid_process)"
        return self.child.log.read_text(errors="replace")


def serve_model(
    grid: Grid,
    engine: Engine,
    host_id: str,
    *,
    state: str = "accepting",
    residency_state: str | None = "ready",
    max_concurrency: int | None = None,
    key: str | None = None,
) -> str:
    """Register ``host_id`` (control record) and ``engine`` on it; returns the node token."""
    token = grid.node_token(host_id)
    residencies: list[dict[str, object]] = []
    if residency_state is not None:
        row: dict[str, object] = {
            "model_id": engine.model,
            "memory_mb": 1024,
            "state": residency_state,
            "active_requests": 0,
        }
        if max_concurrency is not None:
            row["max_concurrency"] = max_concurrency
        residencies.append(row)
    grid.register_host(token, host_id, residencies=residencies, state=state)
    grid.register_engine(
        token, host_id, engine.model, engine.url, key if key is not None else engine.key
    )
    return token


def host_with_cached_model(grid: Grid, host_id: str, model_id: str, sha: str) -> str:
    """Register ``host_id`` holding cached weights of ``model_id`` and give that model a
    baseline profile (min_replicas 1, 4096 MB, exact digest); returns the host's credential."""
    token = grid.node_token(host_id)
    body = {
        "role": "allocator",
        "host_id": host_id,
        "resources": {"capacity_mb": 32768, "runtimes": ["llama.cpp"]},
        "allocator": {
            "schema_version": 1,
            "state": "accepting",
            "cached_artifacts": [{"model_id": model_id, "artifact_sha256": sha}],
            "actuator_capabilities": ["load", "warm", "drain", "unload"],
        },
    }
    grid.register(token, control_record_id(host_id), body)
    grid.client.put_model(model_id, {"memory_mb": 4096, "min_replicas": 1, "artifact_sha256": sha})
    return token


class PeerAs:
    """ASGI wrapper presenting every request as coming from ``peer`` over ``scheme``."""

    def __init__(self, app: Any, peer: tuple[str, int], scheme: str = "http") -> None:
        self.app, self.peer, self.scheme = app, peer, scheme
        self.ctx = getattr(app, "ctx", None)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "client": self.peer, "scheme": self.scheme}
        await self.app(scope, receive, send)
