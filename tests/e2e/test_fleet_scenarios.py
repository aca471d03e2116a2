"""The specification's logical-fleet scenarios on real llama-server hosts (issue 20).

One four-host fleet is started through the shipped CLI; its three models are sized so that
any two replicas never fit one host (a one-model-per-host capacity budget). Profiles are
changed through the operator API and host protection through the node's documented local
override (``grid allocator node drain``), never by patching code:

* **activity** — three replicas of the baseline and one spare host; a loaded host is marked
  user-active: the replica moves make-before-break (the replacement on the spare is ready
  before the old copy is unloaded) and every request meanwhile is answered;
* **contention** — two models under the one-model-per-host budget: both reach their replica
  counts, no host ever holds two, and both answer real requests;
* **preemption with warm-back** — a low-priority service runs on every free host with traffic;
  a high-priority model's baseline appears: an incumbent is really drained and unloaded
  before the beneficiary is warmed there and serves, and the middle-priority baseline never
  has zero ready replicas (relocated make-before-break, or held until the burst can take a
  batch host); when the burst is retired the displaced service warms back and completes a
  streamed request.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fleet_cli import grid, started_fleet
from ports import port

from grid_core.system import wait_until_sync

pytestmark = pytest.mark.e2e

ENGINE_PORT_BASE = port(23800)
"""Engine ports for this module's fleet: clear of the other e2e fleets' ranges."""
GENERAL, CODER, WRITER = "tiny-general.gguf", "tiny-coder.gguf", "tiny-writer.gguf"
WAIT_S = 300.0
"""Upper bound for one convergence on a loaded 2-core machine (bounds the wait, never timed)."""


# --- helpers -------------------------------------------------------------------------------
class Fleet:
    def __init__(self, root: Path, url: str, token: str) -> None:
        self.root, self.url, self.token = root, url, token
        self.http = httpx.Client(timeout=30.0, trust_env=False)

    def status(self) -> dict:
        try:
            r = self.http.get(self.url + "/allocator/status?detail=1")
            return r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def hosts(self) -> list[dict]:
        return (self.status().get("controller") or {}).get("hosts") or []

    def ready_on(self, model: str) -> set[str]:
        return {
            h["host_id"]
            for h in self.hosts()
            for r in h.get("residencies") or []
            if r.get("model_id") == model and r.get("state") == "ready"
        }

    def resident(self) -> dict[str, set[str]]:
        """host → models holding memory there (anything but cached)."""
        return {
            h["host_id"]: {
                r["model_id"] for r in h.get("residencies") or [] if r.get("state") != "cached"
            }
            for h in self.hosts()
        }

    def set_profile(self, model: str, **fields: object) -> None:
        prof = self.http.get(f"{self.url}/allocator/models/{model}").json()["profile"]
        prof.update(fields)
        r = self.http.put(
            f"{self.url}/allocator/models/{model}",
            json=prof,
            headers={"x-grid-allocator-token": self.token},
        )
        assert r.status_code == 200, r.text

    def history(self) -> list[dict]:
        ctl = self.status().get("controller") or {}
        return list(ctl.get("history") or [])

    def chat(self, model: str, *, stream: bool = False) -> int:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hello grid"}],
            "max_tokens": 8,
            "stream": stream,
        }
        if not stream:
            return self.http.post(self.url + "/v1/chat/completions", json=body).status_code
        with self.http.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
            text = b"".join(r.iter_bytes())
            assert r.status_code != 200 or b"[DONE]" in text
            return r.status_code

    def node_override(self, host_id: str, *args: str) -> None:
        """The node's documented local override (``grid allocator node drain|resume ...``)."""
        sdir = str(self.root / "hosts" / host_id)
        done = grid(self.root.parent, "allocator", "node", *args, "--state-dir", sdir)
        assert done.returncode == 0, done.stdout + done.stderr

    def wait(self, what: str, check) -> None:
        assert wait_until_sync(check, timeout_s=WAIT_S, interval_s=1.0), what


class Traffic:
    """Client threads sending one model's requests back to back; statuses counted."""

    def __init__(self, fleet: Fleet, model: str, clients: int = 2) -> None:
        self.fleet, self.model = fleet, model
        self.codes: Counter[int] = Counter()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(timeout=120.0, trust_env=False) as http:
            body = {
                "model": self.model,
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 4,
            }
            while not self.stop.is_set():
                try:
                    code = http.post(self.fleet.url + "/v1/chat/completions", json=body).status_code
                except httpx.TransportError:
                    code = 0
                self.codes[code] += 1

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=130)


class ReadyWatch:
    """Samples, from the allocator status, how many ready replicas one model has (about
    twice a second) while the block runs; ``lowest`` is the fewest seen."""

    def __init__(self, fleet: Fleet, model: str) -> None:
        self.fleet, self.model = fleet, model
        self.samples: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            hosts = self.fleet.hosts()
            if hosts:  # an unanswered status is no evidence either way
                self.samples.append(len(self.fleet.ready_on(self.model)))

    @property
    def lowest(self) -> int:
        return min(self.samples) if self.samples else -1

    def __enter__(self) -> ReadyWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    home = tmp_path_factory.mktemp("scenario-home")
    with started_fleet(
        home, machines=4, capacities_gib="2,2,2,2", engine_port_base=ENGINE_PORT_BASE
    ) as (root, url, token):
        f = Fleet(root, url, token)
        try:
            yield f
        finally:
            f.http.close()


def one_model_per_host(f: Fleet) -> bool:
    return all(len(models) <= 1 for models in f.resident().values())


# --- the scenarios ---------------------------------------------------------------------------
def test_activity_user_active_host_forces_make_before_break_evacuation(fleet: Fleet) -> None:
    f = fleet
    f.set_profile(GENERAL, min_replicas=3, max_replicas=3)
    f.wait("three baseline replicas", lambda: len(f.ready_on(GENERAL)) == 3)
    loaded = sorted(f.ready_on(GENERAL))
    spare = sorted({h["host_id"] for h in f.hosts()} - set(loaded))
    assert len(spare) == 1
    active = loaded[0]
    with Traffic(f, GENERAL) as traffic:
        f.node_override(active, "drain", "--reason", "user active")
        try:
            f.wait(
                "replica evacuated to the spare",
                lambda: (
                    f.ready_on(GENERAL) == set(loaded[1:]) | set(spare)
                    and GENERAL not in f.resident().get(active, set())
                ),
            )
        finally:
            f.node_override(active, "resume")
    # Make before break: the spare's warm succeeded before the old copy's unload was issued.
    hist = f.history()
    warm = [
        a
        for a in hist
        if a["kind"] == "warm" and a["host_id"] == spare[0] and a["status"] == "succeeded"
    ]
    unload = [
        a
        for a in hist
        if a["kind"] == "unload" and a["host_id"] == active and a["model_id"] == GENERAL
    ]
    assert warm and unload, hist
    assert max(a["completed_at"] for a in warm) <= min(a["created_at"] for a in unload)
    print(f"activity: requests during the evacuation {dict(traffic.codes)}")
    assert set(traffic.codes) == {200}, traffic.codes


def test_contention_two_models_under_a_one_model_per_host_budget(fleet: Fleet) -> None:
    f = fleet
    f.set_profile(GENERAL, min_replicas=2, max_replicas=2)
    f.set_profile(CODER, min_replicas=2, max_replicas=2)
    seen_crowded: list[dict] = []

    def converged() -> bool:
        if not one_model_per_host(f):
            seen_crowded.append(f.resident())
        return len(f.ready_on(GENERAL)) == 2 and len(f.ready_on(CODER)) == 2

    f.wait("two replicas of each model", converged)
    assert not seen_crowded, seen_crowded
    assert f.ready_on(GENERAL).isdisjoint(f.ready_on(CODER))
    assert f.chat(GENERAL) == 200 and f.chat(CODER) == 200
    f.set_profile(CODER, min_replicas=0, max_replicas=1)
    f.wait("the coder back to at most one", lambda: len(f.ready_on(CODER)) <= 1)


def test_preemption_drains_incumbents_and_the_displaced_service_warms_back(fleet: Fleet) -> None:
    f = fleet
    f.set_profile(GENERAL, min_replicas=1, max_replicas=1)
    f.set_profile(CODER, min_replicas=3, max_replicas=3)
    f.wait(
        "baseline on one host, the batch service on every other",
        lambda: len(f.ready_on(GENERAL)) == 1 and len(f.ready_on(CODER)) == 3,
    )
    with Traffic(f, CODER) as traffic, ReadyWatch(f, GENERAL) as baseline:
        t_burst = time.time()
        f.set_profile(WRITER, min_replicas=1, max_replicas=1)  # the critical burst
        f.wait("the burst model is served", lambda: len(f.ready_on(WRITER)) == 1)
        served_s = time.time() - t_burst
        assert f.chat(WRITER) == 200
        [burst_host] = f.ready_on(WRITER)
        hist = [a for a in f.history() if a["created_at"] >= t_burst]
        # The priority-50 baseline is never left without a ready replica: if the burst takes
        # its host, the baseline is relocated make-before-break (its replacement warmed on
        # another host before the old copy drains); while the batch replicas are inside their
        # minimum residency it is held, and the burst then takes a batch host instead.
        base_drains = [a for a in hist if a["model_id"] == GENERAL and a["kind"] == "drain"]
        base_warms = [
            a
            for a in hist
            if a["model_id"] == GENERAL and a["kind"] == "warm" and a["status"] == "succeeded"
        ]
        for d in base_drains:
            before = [w for w in base_warms if w["host_id"] != d["host_id"]]
            assert any(w["completed_at"] <= d["created_at"] for w in before), hist
        assert baseline.lowest >= 1, baseline.samples
        ok = [a for a in hist if a["status"] == "succeeded"]
        # The beneficiary took an incumbent's place: whatever held its host was drained and
        # unloaded before its warm began (the staged preemption).
        freed = [a for a in ok if a["kind"] in ("drain", "unload") and a["host_id"] == burst_host]
        warmed = [a for a in hist if a["kind"] == "warm" and a["host_id"] == burst_host]
        warmed = [a for a in warmed if a["model_id"] == WRITER]
        assert {a["kind"] for a in freed} == {"drain", "unload"}, hist
        assert max(a["completed_at"] for a in freed) <= min(a["created_at"] for a in warmed)
        # Retire the burst: the displaced service warms back to its three replicas.
        f.set_profile(WRITER, min_replicas=0, max_replicas=1)
        f.wait(
            "the displaced service is back to three replicas",
            lambda: (
                len(f.ready_on(CODER)) == 3
                and len(f.ready_on(GENERAL)) == 1
                and not f.ready_on(WRITER)
            ),
        )
    assert f.chat(CODER, stream=True) == 200
    print(
        f"preemption: batch-service requests meanwhile {dict(traffic.codes)}; baseline ready "
        f"replicas sampled {len(baseline.samples)} times, lowest {baseline.lowest}; burst host "
        f"{burst_host}, baseline drains {len(base_drains)}, "
        f"burst ready {served_s:.1f} s after it was set (loaded machine)"
    )
    bad = {c: n for c, n in traffic.codes.items() if c not in (200, 503)}
    assert not bad, traffic.codes
