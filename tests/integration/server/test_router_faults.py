"""Router faults under real traffic (issue 16), each closed as a kind, against FAKE engines.

Every test drives the real server over loopback HTTP; the engines are the protocol-faithful
fake (``grid_server.fake_engine``) with fault injection.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest
from server_testbed import Engine, Grid, serve_model

from grid_core.system import wait_until_sync

pytestmark = pytest.mark.integration


@pytest.fixture
def grid(grid_process: Grid) -> Grid:
    """These tests need the server listening on a real port (raw sockets, the CLI, or
    connection behaviour), so they use the server process."""
    return grid_process


CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}


def post(grid: Grid, body: object, path: str = "/v1/chat/completions") -> httpx.Response:
    return grid.http.post(grid.url + path, json=body)


def status(grid: Grid) -> dict[str, object]:
    doc: dict[str, object] = grid.http.get(grid.url + "/allocator/status").json()
    return doc


def open_breakers(grid: Grid) -> list[object]:
    server = status(grid)["server"]
    assert isinstance(server, dict)
    return list(server["open_breakers"])


def profile(grid: Grid, model: str, **fields: object) -> None:
    grid.http.put(
        f"{grid.url}/allocator/models/{model}",
        json={"memory_mb": 1000, **fields},
        headers=grid.operator(),
    ).raise_for_status()


def forecasts(grid: Grid) -> dict[str, dict[str, object]]:
    grid.http.post(grid.url + "/allocator/tick", headers=grid.operator()).raise_for_status()
    doc = grid.http.get(grid.url + "/allocator/status?detail=1").json()
    out: dict[str, dict[str, object]] = doc["controller"]["forecasts"]
    return out


def stream(client: httpx.Client, grid: Grid, model: str) -> int:
    """One streamed chat request read to its end; returns the status."""
    body = {"model": model, "stream": True, **CHAT}
    with client.stream("POST", grid.url + "/v1/chat/completions", json=body) as r:
        for _ in r.iter_bytes():
            pass
        return r.status_code


# --- item 9: a completed stream is a success everywhere ------------------------------------------
def test_streamed_and_non_streamed_requests_forecast_the_same_demand(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    sse, plain = engines("m-sse"), engines("m-json")
    profile(grid, "m-sse")
    profile(grid, "m-json")
    serve_model(grid, sse, "host-sse")
    serve_model(grid, plain, "host-json")
    http = grid.http
    for _ in range(100):
        assert stream(http, grid, "m-sse") == 200
        assert post(grid, {"model": "m-json", **CHAT}).status_code == 200
    fc = forecasts(grid)
    streamed, whole = fc["m-sse"]["request_rate_rps"], fc["m-json"]["request_rate_rps"]
    print(f"forecast: streamed {streamed} req/s, non-streamed {whole} req/s")
    assert isinstance(streamed, float) and isinstance(whole, float)
    assert whole > 0 and streamed == pytest.approx(whole, rel=0.02)


def test_a_streamed_success_closes_an_open_breaker(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    eng = engines("m-heal")
    serve_model(grid, eng, "host-1")
    eng.behave(status=500, count=2)
    assert post(grid, {"model": "m-heal", **CHAT}).status_code == 500
    assert post(grid, {"model": "m-heal", **CHAT}).status_code == 500
    assert open_breakers(grid)
    # The half-open probe is a stream: retry while the breaker still answers 503.
    code = wait_until_sync(
        lambda: (c := stream(grid.http, grid, "m-heal")) != 503 and c,
        timeout_s=10.0,
        interval_s=0.2,
    )
    assert code == 200
    assert open_breakers(grid) == []
    # Closed for real: concurrent requests all go through, not one at a time.
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: stream(grid.http, grid, "m-heal"), range(16)))
    assert codes == [200] * 16


# --- item 6: caller-caused upstream errors -------------------------------------------------------
def test_context_length_500s_leave_the_breaker_closed_for_others(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    eng = engines("m-ctx")
    serve_model(grid, eng, "host-1")
    eng.behave(
        status=500,
        count=2,
        type="server_error",
        message="the request exceeds the available context size, try increasing it",
    )
    for _ in range(2):
        r = post(grid, {"model": "m-ctx", **CHAT})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert "context size" in r.json()["error"]["message"]
    assert open_breakers(grid) == []
    assert post(grid, {"model": "m-ctx", **CHAT}).status_code == 200  # another caller


# --- item 10: nobody can take a model out of service ---------------------------------------------
def test_unauthenticated_embeddings_to_a_chat_model_leave_chat_untouched(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    a, b = engines("m-chat"), engines("m-chat")
    serve_model(grid, a, "host-a")
    serve_model(grid, b, "host-b")
    a.behave(embeddings=False)
    b.behave(embeddings=False)
    anonymous = httpx.Client(trust_env=False, timeout=30.0)  # no credential of any kind
    stop = threading.Event()
    embedding_codes: list[int] = []

    def attack() -> None:
        while not stop.is_set():
            r = anonymous.post(grid.url + "/v1/embeddings", json={"model": "m-chat", "input": "x"})
            embedding_codes.append(r.status_code)
            if embedding_codes[-1] == 400:
                assert r.json()["error"]["code"] == "unsupported_endpoint"

    attacker = threading.Thread(target=attack)
    attacker.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            chat = list(pool.map(lambda _: post(grid, {"model": "m-chat", **CHAT}), range(200)))
    finally:
        stop.set()
        attacker.join()
        anonymous.close()
    assert len(embedding_codes) >= 4
    assert set(embedding_codes) == {400}
    assert [r.status_code for r in chat] == [200] * 200
    assert open_breakers(grid) == []


# --- item 11: never reuse a connection the engine will close -------------------------------------
def test_1000_streams_on_reused_connections_give_no_502(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    eng = engines("m-close")
    serve_model(grid, eng, "host-1")
    # The fake announces keep-alive on every stream, then closes the connection.
    eng.behave(close_after_stream=True, tokens=2)
    codes: dict[int, int] = {}
    with httpx.Client(trust_env=False, timeout=30.0) as client:  # one reused connection
        for i in range(1000):
            code = stream(client, grid, "m-close")
            codes[code] = codes.get(code, 0) + 1
            if i % 50 == 0:  # interleave non-streamed requests on the same pool
                assert post(grid, {"model": "m-close", **CHAT}).status_code == 200
    assert codes == {200: 1000}


# --- item 7: a caller leaving reaches the engine -------------------------------------------------
def test_disconnect_during_a_20s_non_streaming_generation_reaches_the_engine_within_1s(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    eng = engines("m-long")
    serve_model(grid, eng, "host-1")
    eng.behave(delay_ms=20_000)  # the engine answers only after 20 s of "generation"
    body = json.dumps({"model": "m-long", **CHAT}).encode()
    u = urlsplit(grid.url)
    with socket.create_connection((u.hostname, u.port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: grid\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        reached = wait_until_sync(
            lambda: eng.stats()["requests"].get("/v1/chat/completions", 0), timeout_s=10.0
        )
        assert reached, "the request never reached the engine"
        time.sleep(0.5)
        left_at = time.time()
    seen: list[float] = wait_until_sync(lambda: eng.stats()["cancelled_at"], timeout_s=5.0) or []
    assert seen, "the engine kept generating after the caller left"
    delay = seen[0] - left_at
    print(f"engine saw the disconnect {delay * 1000:.0f} ms after the caller left")
    assert delay < 1.0
    assert status(grid)["server"]["inflight_requests"] == 0  # type: ignore[index]


# --- admission: concurrency is a hard boundary ---------------------------------------------------
def test_a_saturated_engine_is_never_piled_on(grid: Grid, engines: Callable[[str], Engine]) -> None:
    eng = engines("m-one")
    serve_model(grid, eng, "host-1", max_concurrency=1)
    # 16 requests of 1.5 s each on a one-slot engine: 24 s of work, more than the queue waits.
    eng.behave(delay_ms=1500)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: post(grid, {"model": "m-one", **CHAT}), range(16)))
    codes = sorted(r.status_code for r in answers)
    assert eng.stats()["max_active"] == 1  # never more than its one slot at once
    assert codes.count(200) >= 2  # the bounded queue let waiting requests through
    assert codes.count(503) >= 1  # and refused those it could not serve in time
    for r in answers:
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "model_saturated"
            assert int(r.headers["retry-after"]) >= 1
    assert set(codes) <= {200, 503}


# --- item 5: demand counts distinct requests, not their retries -----------------------------------
SAME_DEMAND_FACTOR = 1.5
"""Two forecasts of the same 12 requests agree within this factor (bucket timing differs)."""


def test_12_retrying_users_produce_a_desired_count_of_1(grid: Grid) -> None:
    # Two cold models (no host can run them yet): every request gets 503. On m-retry each of
    # 12 users retries for 6 s; on m-once 12 users ask once each and give up.
    shape = {"max_replicas": 3, "replica_concurrency": 4, "expected_service_time_s": 1.0}
    profile(grid, "m-retry", **shape)
    profile(grid, "m-once", **shape)

    # All 24 users start together, so both models' first attempts share the forecast's
    # buckets: threads started one after another on a loaded machine put the second set a
    # bucket later (1.2 vs 0.7 requests/s seen in CI), which the test would blame on retries.
    start = threading.Barrier(24)

    def user(model: str, i: int, retry_for_s: float) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": f"user {i}"}]}
        sent = 0
        with httpx.Client(trust_env=False, timeout=10.0) as c:
            start.wait(timeout=30.0)
            end = time.monotonic() + retry_for_s
            while True:  # an impatient client: retries every 0.1 s
                r = c.post(grid.url + "/v1/chat/completions", json=body)
                assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
                sent += 1
                if time.monotonic() >= end:
                    return sent
                time.sleep(0.1)

    with ThreadPoolExecutor(24) as pool:
        retried = pool.map(lambda i: user("m-retry", i, 6.0), range(12))
        once = pool.map(lambda i: user("m-once", i, 0.0), range(12))
        sent, sent_once = sum(retried), sum(once)
    fc = forecasts(grid)
    print(f"{sent} requests from 12 retrying users -> {fc['m-retry']}")
    assert sent > 12 * 10 and sent_once == 12
    # Ten times the requests, the same demand. The two sets of first attempts may land in
    # different forecast buckets on a loaded machine (0.8 vs 1.1 requests/s seen), so the
    # rates are compared within a factor that counting every retry (10x) could never meet.
    retry_rps, once_rps = fc["m-retry"]["request_rate_rps"], fc["m-once"]["request_rate_rps"]
    assert 0 < retry_rps <= once_rps * SAME_DEMAND_FACTOR, (retry_rps, once_rps)
    assert fc["m-retry"]["desired_replicas"] == 1


# --- item 8: the OpenAI model endpoints ---------------------------------------------------------
def test_get_model_by_id_answers_like_the_openai_api(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    eng = engines("org/m-named")
    serve_model(grid, eng, "host-1")
    r = grid.http.get(grid.url + "/v1/models/org/m-named")
    assert r.status_code == 200
    assert r.json() == {"id": "org/m-named", "object": "model", "created": 0, "owned_by": "grid"}
    missing = grid.http.get(grid.url + "/v1/models/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


# --- item 3: Retry-After from the learned load+warm estimate ------------------------------------
def test_retry_after_is_the_startup_time_left_on_the_host_starting_the_model(grid: Grid) -> None:
    # Priors: 6 s to load the artifact, 4 s to warm the engine; nothing learned yet.
    profile(grid, "m-warming", load_estimate_s=6.0, warm_estimate_s=4.0)
    token = grid.node_token("host-1")
    row = {"model_id": "m-warming", "memory_mb": 1000, "state": "loading", "loaded_age_s": 3.0}
    grid.register_host(token, "host-1", residencies=[row])
    r = post(grid, {"model": "m-warming", **CHAT})
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
    # 10 s from start to ready, 3 s already spent: come back in about 7 s, not a fixed 5 s.
    assert int(r.headers["retry-after"]) in (6, 7)
    time.sleep(1.5)
    later = post(grid, {"model": "m-warming", **CHAT})
    assert int(later.headers["retry-after"]) in (5, 6)
