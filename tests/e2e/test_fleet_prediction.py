"""A learned workflow fetches the next stage's weights ahead of its request (issue 14).

One two-host logical fleet with real llama-server engines, started through the shipped CLI.
Every model fills a host (a one-model-per-host budget): the baseline ``tiny-general`` (A)
holds one host, ``tiny-coder`` (C, made a low-priority baseline) the other, and B is a
high-priority model whose weights come only from an exact source (``hf://``, SHA-256 and
size) served by a loopback mirror at a slow, fixed rate, like a remote link, so a transfer
is a visible part of a cold start. B therefore never has a free slot: a real B request
preempts C; a prediction of B may only fetch and verify its weights (cache only).

The client works as an iterative tool would: A, then B, under one ``X-Grid-Affinity-Key``,
five times. The first B is the cold start *without* a prediction (nothing learned yet, B's
weights on no disk). After the fifth repeat the operator publishes new weights for B (a new
exact revision, on no disk); once the fleet is quiet, the same client sends A again: the
learned edge A→B makes the controller fetch B's new weights onto the host B would start on,
and ``grid allocator status`` marks them predictive, while nothing warms, drains, unloads
or evicts. The next B request is still a cold start (C is displaced for it) but without a
transfer: no load of it fetches, the mirror sees no request, and B warms from the predicted
download. Both cold starts (first byte seen by the client) are printed; the assertions are
on what happened, never on wall-clock times (specification, "Proactive observation and
portfolio planning"). Revision 1 and 2 of B have the same shape and size.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from fleet_cli import FleetApi, grid, started_fleet, wait_for
from loopback_http import serving
from ports import port

pytestmark = pytest.mark.e2e

ENGINE_PORT_BASE = port(23200)
"""Engine ports for this module's fleet: clear of the other e2e fleets' ranges."""
A, C, B = "tiny-general.gguf", "tiny-coder.gguf", "tiny-b.gguf"
"""The workflow's first stage (the fleet's baseline), the low-priority occupant of the
other host, and the predicted next stage (weights only at the mirror)."""
HOST_GIB = 3
"""Each logical host's memory (GiB): any two of the fleet's models exceed one host."""
B_SHARE = 0.62
"""B's memory budget as a share of a host (the fleet's largest default model's share)."""
B_LAYERS, B_EMBEDDING = 4, 256
"""B's GGUF shape: about 5.6 MB, a visible transfer at :data:`MIRROR_BYTES_PER_S`."""
MIRROR_BYTES_PER_S = 1024 * 1024
"""The mirror's send rate (bytes/s): a slow remote link, so fetching B takes seconds."""
MIRROR_CHUNK = 64 * 1024
"""Bytes per paced write of the mirror."""
MIRROR_PATH = "/grid-test/mirror/resolve/main/"
"""Where ``hf://grid-test/mirror/<file>`` resolves under the mirror's URL."""
KEY = "workflow-session-1"
"""The client's affinity key (Grid keeps only a double hash of it)."""
REPEATS = 5
"""Transitions A→B the learner needs before it predicts (specification: five)."""
RETRY_POLL_S = 0.5
"""A cold client's resend interval after a 503 (the router counts a resend as a retry, not
new demand)."""
C_MIN_RESIDENCY_S = 1.0
"""C's minimum residency (s): short, so a B request may preempt C soon after C returns."""
SETTLED_S = 5.0
"""Seconds C must have held its host before the measured A: past its minimum residency, C
(the lowest priority) is the victim a B request would displace, so that is B's one home."""
B_PROFILE: dict[str, object] = {
    "memory_mb": int(HOST_GIB * 1024 * B_SHARE),
    "priority": 100,
    "min_replicas": 0,
    "max_replicas": 1,
    "runtimes": ["llama.cpp"],
    "expected_service_time_s": 0.5,
    "load_estimate_s": 2.0,
    "warm_estimate_s": 3.0,
    "min_residency_s": 1.0,
    "scale_down_cooldown_s": 5.0,
}
"""B's placement profile without its artifact (short residency and cooldown: the fleet is
quiet again soon after the workflow's last B)."""
FLEET_GRID = "test-fleet"
"""The name ``grid test start`` registers the fleet under (``--grid test-fleet``)."""
WIDE = {"COLUMNS": "200"}
"""A wide terminal for the text status, so a host's residencies fit one cell."""
WAIT_S = 240.0
"""Upper bound for one convergence on a loaded 2-core machine (bounds a wait, never timed)."""
MB = 1024 * 1024


# --- the mirror ----------------------------------------------------------------------------
@dataclass
class Mirror:
    """Exact files under :data:`MIRROR_PATH`, sent at :data:`MIRROR_BYTES_PER_S` (Range
    supported); ``gets`` records (file name, monotonic time) of each request."""

    files: dict[str, bytes] = field(default_factory=dict)
    gets: list[tuple[str, float]] = field(default_factory=list)
    url: str = ""


def _handler(mirror: Mirror) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            name = self.path[len(MIRROR_PATH) :] if self.path.startswith(MIRROR_PATH) else ""
            mirror.gets.append((name, time.monotonic()))
            data = mirror.files.get(name)
            if data is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = 0
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes="):
                start = min(int(rng[6:].split("-")[0] or 0), len(data))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            try:
                for at in range(start, len(data), MIRROR_CHUNK):
                    self.wfile.write(data[at : at + MIRROR_CHUNK])
                    time.sleep(MIRROR_CHUNK / MIRROR_BYTES_PER_S)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    return Handler


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mirror]:
    """B's two revisions, written by ``grid test make-model`` outside every model directory
    (no host finds them locally), served on loopback."""
    home = tmp_path_factory.mktemp("mirror")
    state = Mirror()
    for seed, name in ((11, "tiny-b-r1.gguf"), (12, "tiny-b-r2.gguf")):
        path = home / name
        made = grid(home, "test", "make-model", str(path), "--name", "tiny-b",
                    "--layers", str(B_LAYERS), "--embedding", str(B_EMBEDDING),
                    "--seed", str(seed))  # fmt: skip
        assert made.returncode == 0, made.stdout + made.stderr
        state.files[name] = path.read_bytes()
    with serving(_handler(state)) as url:
        state.url = url
        yield state


# --- the fleet as an operator and a client see it ----------------------------------------
class Fleet(FleetApi):
    def chat(self, model: str) -> float:
        """One streamed request under :data:`KEY`, resent every :data:`RETRY_POLL_S` while
        the grid answers 503; seconds from the first attempt to the first response byte."""
        body = {
            "model": model,
            "stream": True,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": f"next stage: {model}"}],
        }
        headers = {"X-Grid-Affinity-Key": KEY}
        t0 = time.monotonic()
        while True:
            with self.http.stream(
                "POST", self.url + "/v1/chat/completions", json=body, headers=headers
            ) as r:
                if r.status_code == 200:
                    chunks = r.iter_bytes()
                    head = next(chunks)
                    first = time.monotonic() - t0
                    assert b"[DONE]" in head + b"".join(chunks)
                    return first
                r.read()
                assert r.status_code == 503, (r.status_code, r.text)
            assert time.monotonic() - t0 < WAIT_S, f"{model} still 503 after {WAIT_S} s"
            time.sleep(RETRY_POLL_S)

    def settled(self) -> dict[str, set[str]] | None:
        """The placement when A and C hold one host each and nothing else holds memory."""
        p = self.placement()
        return p if sorted(map(sorted, p.values())) == sorted([[A], [C]]) else None

    def loaded_at(self, model: str) -> float | None:
        """When the ready replica of ``model`` started (server-clock Unix seconds)."""
        for h in self.controller().get("hosts") or []:
            for r in h.get("residencies") or []:
                if r["model_id"] == model and r["state"] == "ready":
                    return r.get("loaded_at")
        return None

    def cached(self, model: str) -> dict[str, dict[str, Any]]:
        """host → the status row of ``model``'s weights on its disk."""
        return {
            h["host_id"]: c
            for h in self.controller().get("hosts") or []
            for c in h.get("cached") or []
            if c["model_id"] == model
        }


def _loads(actions: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    return [a for a in actions if a["kind"] == "load" and a["model_id"] == model]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, mirror: Mirror) -> Iterator[Fleet]:
    home = tmp_path_factory.mktemp("prediction-home")
    with started_fleet(
        home,
        machines=2,
        engine_port_base=ENGINE_PORT_BASE,
        capacities_gib=f"{HOST_GIB},{HOST_GIB}",
        extra_env={"GRID_HF_ENDPOINT": mirror.url},
    ) as (_root, url, token):
        f = Fleet(home, url, token)
        try:
            yield f
        finally:
            f.http.close()


def _b_revision(mirror: Mirror, name: str) -> dict[str, object]:
    data = mirror.files[name]
    return {
        "artifact_source": f"hf://grid-test/mirror/{name}",
        "artifact_sha256": hashlib.sha256(data).hexdigest(),
        "artifact_size_mb": -(-len(data) // MB),
    }


def _train(fleet: Fleet, c_host: str) -> float:
    """The workflow A→B under :data:`KEY`, :data:`REPEATS` times; returns the first B's cold
    start (seconds to first byte), the cold start without a prediction: nothing is learned
    yet and B's weights are on no disk, so its load fetches them from the mirror."""
    cold_without = 0.0
    for i in range(REPEATS):
        fleet.chat(A)
        since = time.time()
        took = fleet.chat(B)
        if i == 0:
            cold_without = took
            [fetch] = _loads(fleet.actions(since), B)
            assert fetch["message"].startswith("fetched"), fetch
            assert fetch["host_id"] == c_host
            assert not [
                p for p in fleet.controller().get("predictions") or [] if p["model_id"] == B
            ]
            print(
                f"\nwithout prediction: B's first byte {took:.1f} s after its first attempt; "
                f"its load fetched the weights at {MIRROR_BYTES_PER_S // 1024} KiB/s in "
                f"{fetch['completed_at'] - fetch['delivered_at']:.1f} s"
            )
    return cold_without


def _operator_sees_predictive_cache(fleet: Fleet, host_id: str, sha256: object) -> None:
    """``grid allocator status`` (JSON and text) marks the host's download of B predictive."""
    out = grid(fleet.home, "allocator", "status", "--json", "--grid", FLEET_GRID)
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    [host] = [h for h in doc["controller"]["hosts"] if h["host_id"] == host_id]
    [row] = [c for c in host["cached"] if c["model_id"] == B]
    assert (row["artifact_sha256"], row["predictive"]) == (sha256, True), row
    text = grid(fleet.home, "allocator", "status", "--grid", FLEET_GRID, extra_env=WIDE)
    assert f"{B}:cached(predictive)" in "".join(text.stdout.split()), text.stdout


def test_a_learned_workflow_fetches_the_next_stage_before_its_request(
    fleet: Fleet, mirror: Mirror
) -> None:
    # C becomes a low-priority baseline on the host A does not hold; B (priority above both)
    # has weights only at the mirror. Short residencies and cooldown keep the test brief.
    fleet.put_profile(C, {"min_replicas": 1, "min_residency_s": C_MIN_RESIDENCY_S})
    r1, r2 = _b_revision(mirror, "tiny-b-r1.gguf"), _b_revision(mirror, "tiny-b-r2.gguf")
    fleet.put_profile(B, {**B_PROFILE, **r1})
    hosts = wait_for(fleet.settled, "A and C on one host each", WAIT_S)
    c_host = next(h for h, models in hosts.items() if C in models)
    cold_without = _train(fleet, c_host)

    # The operator publishes new weights for B (on no disk yet) once the fleet is quiet: B's
    # demand has passed, B left its host, C is back past its minimum residency, and nothing
    # is predicted (the client's session ended on B).
    def quiet() -> bool:
        ctl, c_since = fleet.controller(), fleet.loaded_at(C)
        return (
            fleet.settled() is not None
            and c_since is not None
            and c_since < time.time() - SETTLED_S
            and not ctl.get("predictions")
            and not ctl.get("pending_commands")
        )

    wait_for(quiet, "B gone, C back and nothing predicted", WAIT_S)
    fleet.put_profile(B, r2)
    sha2 = r2["artifact_sha256"]
    assert not [c for c in fleet.cached(B).values() if c["artifact_sha256"] == sha2]

    # A again under the same key: the learned edge predicts B. Its new weights are fetched
    # and verified on the host B would start on; nothing warms, drains, unloads or evicts.
    since = time.time()
    fleet.chat(A)
    asked = time.monotonic()

    def predicted() -> str | None:
        rows = fleet.cached(B).items()
        return next((h for h, c in rows if c["artifact_sha256"] == sha2 and c["predictive"]), None)

    assert wait_for(predicted, "B's new weights cached as predictive", WAIT_S) == c_host
    lead = time.monotonic() - asked
    [pred] = [p for p in fleet.controller()["predictions"] if p["kind"] == "sequence"]
    assert (pred["model_id"], pred["edge"], pred["support"]) == (B, f"{A}→{B}", REPEATS)
    done = fleet.actions(since)
    assert [(a["kind"], a["model_id"], a["reason"], a["status"]) for a in done] == [
        ("load", B, "predictive_prefetch", "succeeded")
    ], done
    assert done[0]["message"].startswith("fetched"), done[0]  # hashed before it was published
    assert fleet.settled() == hosts
    assert [n for n, at in mirror.gets if at > asked] == ["tiny-b-r2.gguf"]
    _operator_sees_predictive_cache(fleet, c_host, sha2)

    # B's request: still a cold start (C is displaced for it), but without a transfer: no
    # load fetches, the mirror sees no request, and B warms from the predicted download.
    since = time.time()
    cold_with = fleet.chat(B)
    served = fleet.actions(since)
    assert not [a for a in _loads(served, B) if not a["message"].startswith("verified")], served
    assert ("warm", c_host, B, "succeeded") in [
        (a["kind"], a["host_id"], a["model_id"], a["status"]) for a in served
    ], served
    assert {a["model_id"] for a in served if a["kind"] in ("drain", "unload")} <= {C}, served
    assert [n for n, at in mirror.gets if at > asked] == ["tiny-b-r2.gguf"]
    # Used, the download is ordinary cache: the predictive lifecycle no longer touches it.
    wait_for(
        lambda: (c := fleet.cached(B).get(c_host)) is not None and not c["predictive"],
        "B's cache no longer predictive",
        WAIT_S,
    )
    print(
        f"with prediction: B's new weights fetched and verified {lead:.1f} s after A was "
        f"answered; B's first byte {cold_with:.1f} s after its first attempt "
        f"(without prediction: {cold_without:.1f} s); B's cold path: "
        + ", ".join(f"{a['kind']} {a['model_id']}" for a in served)
    )
