"""Revision rollout on real llama-server hosts: traffic is served throughout.

A real server and two real detached node agents (two hosts on this machine, each with its
own models directory), a tiny GGUF in two revisions (two seeds: two SHA-256 digests). While
a client keeps sending chat requests through the server, the operator changes the profile's
``artifact_sha256``: the new revision is warmed on the other host before the old replica
drains, no request fails, and the fleet ends with only the new digest.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
from fleet_cli import cli, wait_for, write_node_token
from grid_llamacpp.artifacts import sha256_file
from grid_llamacpp.tinymodel import TinyModelSpec, make_model
from ports import port_range

from grid_server.harness import Testbed, start_server

pytestmark = pytest.mark.e2e

PORT_RANGES = tuple("{}-{}".format(*port_range(low, low + 9)) for low in (22850, 22860))
"""Managed ports of the two agents (their blocks in the table of docs/testing.md)."""
MODEL = "tiny-roll.gguf"
HOSTS = ("host-roll-a", "host-roll-b")


def _residencies(client: Testbed) -> list[dict[str, object]]:
    status = client.client.status(detail=True)["controller"]
    return [
        r
        for h in status.get("hosts", [])
        for r in h.get("residencies", [])
        if r["model_id"] == MODEL and r["state"] != "cached"
    ]


class Traffic(threading.Thread):
    """Sends chat requests one after another through the server until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.codes: Counter[int] = Counter()
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=60.0, trust_env=False) as http:
            while not self.halt.is_set():
                try:
                    r = http.post(
                        f"{self.url}/v1/chat/completions",
                        json={
                            "model": MODEL,
                            "max_tokens": 4,
                            "messages": [{"role": "user", "content": "hi"}],
                        },
                    )
                    self.codes[r.status_code] += 1
                    if r.status_code != 200:
                        self.failures.append(f"{r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as exc:
                    self.codes[0] += 1
                    self.failures.append(f"{type(exc).__name__}: {exc}")


def test_revision_rollout_keeps_serving_and_ends_with_only_the_new_digest(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_server(home, tick_interval_s=0.5)
    client = Testbed(server.url, home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRID_")}
    env["GRID_HOME"] = str(home)
    old_file, new_file = tmp_path / "rev1.gguf", tmp_path / "rev2.gguf"
    make_model(old_file, TinyModelSpec(name="tiny-roll", seed=11))
    make_model(new_file, TinyModelSpec(name="tiny-roll", seed=12))
    old_sha, new_sha = sha256_file(old_file), sha256_file(new_file)
    assert old_sha != new_sha
    state_dirs = [tmp_path / f"node-{i}" for i in range(2)]
    traffic = Traffic(server.url)
    try:
        for i, host_id in enumerate(HOSTS):
            models = tmp_path / f"models-{i}"
            models.mkdir()
            shutil.copyfile(old_file, models / MODEL)
            token = client.node_token(host_id)
            token_file = write_node_token(tmp_path / f"token-{i}", host_id, token)
            started = cli(
                env,
                *("allocator", "node", "start", "--grid", server.url),
                *("--token-file", str(token_file), "--state-dir", str(state_dirs[i])),
                *("--port-range", PORT_RANGES[i], "--models-dir", str(models)),
                *("--heartbeat-interval", "0.5"),
            )
            assert started.returncode == 0, started.stderr + started.stdout
        ops = client.operator()
        profile = {
            "memory_mb": 64,
            "min_replicas": 1,
            "max_replicas": 1,
            "min_residency_s": 0.0,
            "artifact_sha256": old_sha,
        }
        url = f"{server.url}/allocator/models/{MODEL}"
        assert client.http.put(url, headers=ops, json=profile).status_code == 200
        r = client.http.put(f"{server.url}/allocator/mode", headers=ops, json={"mode": "automatic"})
        assert r.status_code == 200, r.text
        client.wait_ready(MODEL, timeout_s=240.0)
        wait_for(
            lambda: [x.get("artifact_sha256") for x in _residencies(client)] == [old_sha],
            "one ready replica of the old revision",
        )
        traffic.start()
        wait_for(lambda: traffic.codes[200] >= 3, "traffic to be served")

        # The new revision's file appears on both hosts (an atomic replace: the running engine
        # keeps its open file), then the operator changes the digest, naming the version read.
        for i in range(2):
            staged = tmp_path / f"models-{i}" / f".{MODEL}.new"
            shutil.copyfile(new_file, staged)
            os.replace(staged, tmp_path / f"models-{i}" / MODEL)
        current = client.http.get(url)
        changed = client.http.put(
            url,
            headers={**ops, "If-Match": current.headers["etag"]},
            json={**current.json()["profile"], "artifact_sha256": new_sha},
        )
        assert changed.status_code == 200, changed.text
        served_before = traffic.codes[200]

        def only_new() -> bool:
            res = _residencies(client)
            return [x.get("artifact_sha256") for x in res] == [new_sha] and res[0][
                "state"
            ] == "ready"

        wait_for(only_new, "only the new revision left serving")
        wait_for(lambda: traffic.codes[200] >= served_before + 3, "traffic on the new revision")
    finally:
        traffic.halt.set()
        if traffic.is_alive():
            traffic.join(timeout=120)
        for state_dir in state_dirs:
            cli(env, "allocator", "node", "stop", "--state-dir", str(state_dir))
        client.close()
        server.stop()
    print(f"revision rollout under traffic: status codes {dict(traffic.codes)}")
    assert traffic.failures == [], traffic.failures[:5]
    assert traffic.codes[200] > 0
