"""A cold model after a burst, on the logical fleet with real llama-server engines (issue 16).

A burst of named requests spreads the baseline model (priority 50) over all three hosts, so
no host has room for anything else. Right after the burst a client asks for a model nobody
runs yet, of *lower* priority than the baseline. The baseline's extra replicas are surplus once
the burst is no longer live: idle, past their minimum residency, and held only by the
scale-down cooldown. Grid reclaims one of them for the cold model's direct demand, and the
503s it answers meanwhile carry a Retry-After long enough for the official OpenAI client with
its default retry budget (two retries honouring Retry-After) to get its answer. The baseline
never loses its last ready replica.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from fleet_cli import started_fleet
from ports import port

pytestmark = pytest.mark.e2e

ENGINE_PORT_BASE = port(23700)
"""Engine ports for this module's fleet: clear of the other e2e modules' ranges."""
BASELINE, COLD = "tiny-general.gguf", "tiny-coder.gguf"
BURST_CLIENTS = 24
"""Concurrent named requests of the burst: enough queueing to want every host."""
BURST_LIMIT_S = 180.0
"""The burst gives up if three replicas never become ready (a failure, not a skip)."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("surplus-home")
    with started_fleet(home, machines=3, engine_port_base=ENGINE_PORT_BASE) as (_, url, _):
        yield url


def _status(c: httpx.Client, url: str) -> dict:
    doc = c.get(url + "/allocator/status", params={"detail": "1"}).json()
    return doc["controller"]


def _ready_hosts(controller: dict, model: str) -> list[str]:
    return [
        h["host_id"]
        for h in controller["hosts"]
        for r in h["residencies"]
        if r["model_id"] == model and r["state"] == "ready"
    ]


def _burst_until_every_host_holds_the_baseline(url: str) -> float:
    """Named requests from many clients until all three hosts hold a ready baseline replica;
    returns the seconds it took."""
    stop = threading.Event()
    body = {"model": BASELINE, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}

    def client() -> None:
        with httpx.Client(trust_env=False, timeout=60.0) as c:
            while not stop.is_set():
                c.post(url + "/v1/chat/completions", json=body)

    workers = [threading.Thread(target=client) for _ in range(BURST_CLIENTS)]
    t0 = time.monotonic()
    for w in workers:
        w.start()
    try:
        with httpx.Client(trust_env=False, timeout=10.0) as c:
            while len(_ready_hosts(_status(c, url), BASELINE)) < 3:
                assert time.monotonic() - t0 < BURST_LIMIT_S, "the burst never spread to 3 hosts"
                time.sleep(0.5)
    finally:
        stop.set()
        for w in workers:
            w.join()
    return time.monotonic() - t0


def test_default_openai_client_gets_a_cold_model_after_a_burst_filled_every_host(fleet):
    url = fleet
    spread_s = _burst_until_every_host_holds_the_baseline(url)
    with httpx.Client(trust_env=False, timeout=10.0) as c:
        assert len(_ready_hosts(_status(c, url), BASELINE)) == 3

    # The baseline must stay served throughout: never its last ready replica.
    baseline_gone: list[float] = []
    cold_ready: list[float] = []
    stop = threading.Event()

    def watch_models() -> None:
        with httpx.Client(trust_env=False, timeout=10.0) as c:
            while not stop.is_set():
                ids = [m["id"] for m in c.get(url + "/v1/models").json()["data"]]
                if BASELINE not in ids:
                    baseline_gone.append(time.monotonic())
                if COLD in ids and not cold_ready:
                    cold_ready.append(time.monotonic())
                stop.wait(0.2)

    watcher = threading.Thread(target=watch_models)
    watcher.start()
    t0 = time.monotonic()
    answers: list[tuple[float, int, str | None]] = []  # (s since first try, status, Retry-After)

    def seen(r: httpx.Response) -> None:
        answers.append(
            (round(time.monotonic() - t0, 1), r.status_code, r.headers.get("retry-after"))
        )

    # Default retry settings; the HTTP client only records each answer it sees.
    client = openai.OpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        http_client=httpx.Client(trust_env=False, event_hooks={"response": [seen]}),
    )
    try:
        done = client.chat.completions.create(
            model=COLD, max_tokens=4, messages=[{"role": "user", "content": "Reply with OK"}]
        )
    except openai.APIStatusError as exc:
        raise AssertionError(f"the default client gave up: answers {answers}") from exc
    finally:
        client.close()  # closes its HTTP client too: no pooled socket outlives the test
        stop.set()
        watcher.join()
    took = time.monotonic() - t0
    ready = f"{cold_ready[0] - t0:.1f} s" if cold_ready else "not seen"
    print(
        f"burst spread {BASELINE} over 3 hosts in {spread_s:.1f} s; default OpenAI client: "
        f"first request for cold {COLD} answered in {took:.1f} s, the model ready after "
        f"{ready} (answers: seconds, status, Retry-After {answers})"
    )
    assert done.choices[0].message.content is not None
    assert baseline_gone == [], "the baseline lost its last ready replica"

    with httpx.Client(trust_env=False, timeout=10.0) as c:
        controller = _status(c, url)
    reclaims = [
        a
        for a in controller["history"]
        if a["kind"] == "drain" and a["model_id"] == BASELINE and a["beneficiary"] == COLD
    ]
    assert reclaims, "no baseline replica was drained for the cold model"
    assert len(_ready_hosts(controller, BASELINE)) >= 1
