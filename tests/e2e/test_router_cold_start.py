"""Cold starts a client survives, on the logical fleet with real llama-server engines.

A three-host fleet holds the baseline model on one host; the other two are free. A model
that no host runs yet is asked for the way real clients ask: the official OpenAI client
with its default retry budget, and a client that sleeps exactly the advised Retry-After.
Both times are printed; the second is held to the router's promise: once the engine is
ready, a client honouring Retry-After is answered within 2 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from fleet_cli import fleet_status, started_fleet
from ports import port

pytestmark = pytest.mark.e2e

ENGINE_PORT_BASE = port(23500)
"""Engine ports for this module's fleet: clear of the other e2e modules' ranges."""
ANSWERED_AFTER_READY_S = 2.0
"""Promise under test: a Retry-After-honouring client is answered within 2 s of readiness."""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    home = tmp_path_factory.mktemp("cold-start-home")
    with started_fleet(home, machines=3, engine_port_base=ENGINE_PORT_BASE):
        yield fleet_status(home)


def _cold_models(doc: dict[str, object]) -> list[str]:
    models = doc["models"]
    assert isinstance(models, list)
    return [m["model_id"] for m in models if m["min_replicas"] == 0]


def test_default_openai_client_first_request_for_a_cold_model_succeeds(fleet):
    cold = _cold_models(fleet)[0]
    # Default retries; closed afterwards so no pooled socket outlives the test.
    with openai.OpenAI(base_url=f"{fleet['url']}/v1", api_key="unused") as client:
        t0 = time.monotonic()
        done = client.chat.completions.create(
            model=cold, max_tokens=4, messages=[{"role": "user", "content": "Reply with OK"}]
        )
    took = time.monotonic() - t0
    print(f"default OpenAI client: first request for cold {cold} answered in {took:.1f} s")
    assert done.choices[0].message.content is not None


def test_a_client_honouring_retry_after_is_answered_within_2s_of_readiness(fleet):
    cold = _cold_models(fleet)[1]
    url = str(fleet["url"])
    ready_at: list[float] = []
    stop = threading.Event()

    def watch_ready() -> None:
        with httpx.Client(trust_env=False, timeout=10.0) as c:
            while not stop.is_set() and not ready_at:
                ids = [m["id"] for m in c.get(url + "/v1/models").json()["data"]]
                if cold in ids:
                    ready_at.append(time.monotonic())
                stop.wait(0.05)

    watcher = threading.Thread(target=watch_ready)
    watcher.start()
    body = {"model": cold, "max_tokens": 4, "messages": [{"role": "user", "content": "OK?"}]}
    advised: list[int] = []
    t0 = time.monotonic()
    try:
        with httpx.Client(trust_env=False, timeout=60.0) as c:
            while True:
                r = c.post(url + "/v1/chat/completions", json=body)
                if r.status_code != 503:
                    break
                advised.append(int(r.headers["retry-after"]))
                assert 1 <= advised[-1] <= 30
                assert time.monotonic() - t0 < 300, f"still 503 after 5 min: {advised}"
                time.sleep(advised[-1])
    finally:
        stop.set()
        watcher.join()
    answered = time.monotonic()
    assert r.status_code == 200, r.text
    assert ready_at, "the model never appeared in /v1/models"
    start_s, after_ready = ready_at[0] - t0, answered - ready_at[0]
    print(
        f"Retry-After client: engine ready {start_s:.1f} s after the first request, "
        f"answered {after_ready:.1f} s after that (advised waits {advised})"
    )
    assert after_ready <= ANSWERED_AFTER_READY_S
