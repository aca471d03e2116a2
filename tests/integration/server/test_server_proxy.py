"""The OpenAI-compatible proxy against FAKE engines, with httpx and the official client."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import openai
import pytest
from server_testbed import Engine, Grid, host_with_cached_model, serve_model

from grid_core import routing
from grid_core.routing import MAX_COLD_RETRY_AFTER_S, UNKNOWN_STARTUP_RETRY_AFTER_S
from grid_core.system import wait_until_sync
from grid_core.wire import AFFINITY_HEADER
from grid_server.proxy import MAX_BODY_BYTES

pytestmark = pytest.mark.integration

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}


def post(
    grid: Grid,
    body: object,
    path: str = "/v1/chat/completions",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return grid.http.post(grid.url + path, json=body, headers=headers)


def test_non_streaming_chat_through_httpx(grid: Grid, engines: Callable[[str], Engine]) -> None:
    eng = engines("m-plain")
    serve_model(grid, eng, "host-1")
    r = post(grid, {"model": "m-plain", **CHAT})
    assert r.status_code == 200
    doc = r.json()
    assert doc["object"] == "chat.completion"
    assert doc["choices"][0]["message"]["content"].startswith("tok0")
    assert doc["usage"]["completion_tokens"] == 5
    assert "authorization" not in {k.lower() for k in r.headers}


def test_streaming_chat_arrives_as_sse_with_final_usage(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    eng = engines("m-sse")
    serve_model(grid, eng, "host-1")
    with grid.http.stream(
        "POST", grid.url + "/v1/chat/completions", json={"model": "m-sse", "stream": True, **CHAT}
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text.split() == [f"tok{i}" for i in range(5)]
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_official_openai_client_streaming_and_not(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    eng = engines("m-oai")
    serve_model(grid, eng, "host-1")
    client = openai.OpenAI(
        base_url=grid.url + "/v1",
        api_key="unused-by-grid",
        http_client=grid.http,
        max_retries=0,
    )
    # Not closed here: closing the OpenAI client would close grid.http, which the fixture owns.
    assert [m.id for m in client.models.list()] == ["m-oai"]
    done = client.chat.completions.create(
        model="m-oai", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert done.choices[0].message.content == "tok0 tok1 tok2"
    assert done.usage is not None and done.usage.completion_tokens == 3
    stream = client.chat.completions.create(
        model="m-oai",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(parts).split() == ["tok0", "tok1", "tok2", "tok3"]
    assert usage is not None and usage.completion_tokens == 4
    comp = client.completions.create(model="m-oai", prompt="once", max_tokens=2)
    assert comp.choices[0].text == "tok0 tok1"
    emb = client.embeddings.create(model="m-oai", input=["a", "b"])
    assert len(emb.data) == 2 and emb.data[0].embedding == [0.0, 0.5, 1.0]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_errors_are_honest_and_openai_shaped(grid: Grid) -> None:
    http = grid.http
    profile = {"memory_mb": 1000}
    http.put(
        grid.url + "/allocator/models/m-cold", json=profile, headers=grid.operator()
    ).raise_for_status()
    r = post(grid, {"model": "m-cold", **CHAT})
    assert r.status_code == 503
    # Nothing is planned for it (no host): the next planning pass is the soonest news.
    assert r.headers["retry-after"] == str(UNKNOWN_STARTUP_RETRY_AFTER_S)
    assert r.json()["error"]["code"] == "model_not_ready"
    r = post(grid, {"model": "never-configured", **CHAT})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = http.post(grid.url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = http.post(grid.url + "/v1/chat/completions", content=b"[1, 2]")
    assert r.status_code == 400
    big = b'{"model": "m-cold", "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
    r = http.post(grid.url + "/v1/chat/completions", content=big)
    assert r.status_code == 413
    assert grid.http.get(grid.url + "/healthz").status_code == 200


def test_a_model_no_host_can_serve_says_why_instead_of_asking_to_wait(grid: Grid) -> None:
    """A profile whose runtime no host offers will never start by waiting: once a pass has
    planned it, the 503 names the reason and the fix instead of "retry shortly"."""
    host_with_cached_model(grid, "host-1", "m-base", "a" * 64)
    grid.client.put_model("m-vllm", {"memory_mb": 1000, "min_replicas": 1, "runtimes": ["vllm"]})
    grid.http.post(grid.url + "/allocator/tick", headers=grid.operator()).raise_for_status()
    r = post(grid, {"model": "m-vllm", **CHAT})
    err = r.json()["error"]
    assert (r.status_code, err["code"]) == (503, "model_unplaceable"), r.text
    assert "cannot be placed on any host" in err["message"] and "vllm" in err["message"]
    assert "grid allocator explain m-vllm" in err["message"]
    assert err["message"].count("m-vllm") == 2, err["message"]  # the subject, then the command
    assert r.headers["retry-after"] == str(MAX_COLD_RETRY_AFTER_S)
    # A model that can be placed still gets the ordinary cold-start advice.
    r = post(grid, {"model": "m-base", **CHAT})
    assert (r.status_code, r.json()["error"]["code"]) == (503, "model_not_ready")


def test_a_just_started_server_waits_for_hosts_to_register_before_calling_a_model_unplaceable(
    started_grid: Grid,
) -> None:
    """Right after a (re)start only some hosts have registered again; the one that can run a
    model may be next. Inside the registration grace that model's request is an ordinary
    cold start (503 model_not_ready, retry advised), while status already shows the plan's
    reason for the operator."""
    grid = started_grid
    host_with_cached_model(grid, "host-1", "m-base", "a" * 64)
    grid.client.put_model("m-vllm", {"memory_mb": 1000, "min_replicas": 1, "runtimes": ["vllm"]})
    grid.http.post(grid.url + "/allocator/tick", headers=grid.operator()).raise_for_status()
    r = post(grid, {"model": "m-vllm", **CHAT})
    err = r.json()["error"]
    assert (r.status_code, err["code"]) == (503, "model_not_ready"), r.text
    assert "no host registered so far can run it" in err["message"] and "vllm" in err["message"]
    assert "still registering" in err["message"]
    assert int(r.headers["retry-after"]) >= 1
    status = grid.http.get(grid.url + "/allocator/status", headers=grid.operator()).json()
    unmet = status["controller"]["unmet"]
    assert [u["code"] for u in unmet if u["model_id"] == "m-vllm"] == ["no_eligible_host"]
    # model set's warning names the 503 a request gets now, and what follows the grace.
    (warning,) = grid.client.put_model("m-vllm0", {"memory_mb": 1000, "runtimes": ["vllm"]})[
        "warnings"
    ]
    assert "still registering" in warning and "gets model_not_ready, then model_unplaceable" in (
        warning
    )


def test_the_first_request_for_a_model_no_host_can_run_is_told_at_once(grid: Grid) -> None:
    """No pass needs to plan its demand first: the very first request for a profile (no
    minimum replicas) that no live host is compatible with already gets the reason."""
    host_with_cached_model(grid, "host-1", "m-base", "a" * 64)
    grid.client.put_model("m-vllm0", {"memory_mb": 1000, "runtimes": ["vllm"]})
    r = post(grid, {"model": "m-vllm0", **CHAT})
    err = r.json()["error"]
    assert (r.status_code, err["code"]) == (503, "model_unplaceable"), r.text
    assert (
        "runtimes: none of the 1 registered host(s) can run it (they offer llama.cpp)"
        in (err["message"])
    )


def test_a_model_larger_than_every_host_says_why_instead_of_asking_to_wait(grid: Grid) -> None:
    """One replica needing more memory than any host holds even when empty will not start
    by waiting either: the 503 names memory_mb and the largest host."""
    host_with_cached_model(grid, "host-1", "m-base", "a" * 64)  # a 32768 MB host
    grid.client.put_model("m-huge", {"memory_mb": 50_000, "min_replicas": 1})
    grid.http.post(grid.url + "/allocator/tick", headers=grid.operator()).raise_for_status()
    r = post(grid, {"model": "m-huge", **CHAT})
    err = r.json()["error"]
    assert (r.status_code, err["code"]) == (503, "model_unplaceable"), r.text
    assert "memory_mb: one replica needs 50000 MB" in err["message"]
    assert (
        "host-1, 32768 MB" in err["message"] and "grid allocator explain m-huge" in err["message"]
    )
    # One that fits the host once it is free still gets the ordinary cold-start advice.
    grid.client.put_model("m-fits", {"memory_mb": 30_000, "min_replicas": 1})
    grid.http.post(grid.url + "/allocator/tick", headers=grid.operator()).raise_for_status()
    r = post(grid, {"model": "m-fits", **CHAT})
    assert (r.status_code, r.json()["error"]["code"]) == (503, "model_not_ready"), r.text


def test_a_missing_input_field_or_wrong_method_gets_an_openai_error(grid: Grid) -> None:
    """A client library reads ``param`` and a string ``code`` (OpenAI's error shape); a GET on
    a POST route is a 405 with ``Allow``, not a 404 that says the route does not exist."""
    http = grid.http
    r = http.post(grid.url + "/v1/chat/completions", json={"model": "never-configured"})
    err = r.json()["error"]
    assert r.status_code == 400
    assert (err["param"], err["code"]) == ("messages", "missing_required_parameter")
    r = http.post(grid.url + "/v1/embeddings", json={"model": "m", "input": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = http.post(grid.url + "/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = http.get(grid.url + "/v1/chat/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["code"] == "method_not_allowed"
    r = http.post(grid.url + "/v1/models", json={})
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    r = http.get(grid.url + "/v1/nothing-here")
    assert r.status_code == 404 and isinstance(r.json()["error"]["code"], str)


def test_failed_post_is_never_replayed(grid: Grid, engines: Callable[[str], Engine]) -> None:
    a, b = engines("m-dup"), engines("m-dup")
    serve_model(grid, a, "host-a")
    serve_model(grid, b, "host-b")
    a.behave(status=500, count=100)
    b.behave(status=500, count=100)
    r = post(grid, {"model": "m-dup", **CHAT})
    assert r.status_code == 500
    assert a.requests() + b.requests() == 1


def test_unreachable_sole_engine_gives_503_with_retry_after(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    eng = engines("m-gone")
    serve_model(grid, eng, "host-1")
    eng.child.stop()
    r = post(grid, {"model": "m-gone", **CHAT})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "upstream_unreachable"
    assert int(r.headers["retry-after"]) >= 1


def test_router_retry_when_nothing_was_sent_goes_to_another_ready_replica(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    """A replica whose port refuses connections (killed, route not yet withdrawn) costs no
    request: each one that picked it is sent to the live replica instead, exactly once."""
    live, dead = engines("m-two"), engines("m-two")
    serve_model(grid, live, "host-live")
    serve_model(grid, dead, "host-dead")
    dead.child.stop()
    codes = [post(grid, {"model": "m-two", **CHAT}).status_code for _ in range(40)]
    assert codes == [200] * 40
    # Each request reached an engine once: nothing was duplicated by the retry.
    assert live.requests() == 40


def test_breaker_steers_the_next_request_after_a_429(
    grid: Grid, engines: Callable[[str], Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The in-process server reads the cooldown per 429: a minute instead of one second keeps
    # the breaker open between the two requests however slowly a loaded machine runs them.
    monkeypatch.setattr(routing, "RATE_LIMIT_COOLDOWN_S", 60.0)
    a, b = engines("m-cb"), engines("m-cb")
    serve_model(grid, a, "host-a")
    serve_model(grid, b, "host-b")
    a.behave(status=429, count=1000)
    b.behave(status=429, count=1000)
    first = post(grid, {"model": "m-cb", **CHAT})
    assert first.status_code == 429
    first_engine = a if a.requests() == 1 else b
    other = b if first_engine is a else a
    other.behave(status=0, count=0)
    second = post(grid, {"model": "m-cb", **CHAT})
    assert second.status_code == 200
    assert first_engine.requests() == 1 and other.requests() == 1
    status = grid.http.get(grid.url + "/allocator/status").json()
    assert [br["model_id"] for br in status["server"]["open_breakers"]] == ["m-cb"]
    # Circuit state steers requests but never changes discovery.
    ids = [m["id"] for m in grid.http.get(grid.url + "/v1/models").json()["data"]]
    assert ids == ["m-cb"]


def test_caller_400_does_not_open_the_breaker(grid: Grid, engines: Callable[[str], Engine]) -> None:
    eng = engines("m-400")
    serve_model(grid, eng, "host-1")
    eng.behave(status=400, count=5)
    for _ in range(5):
        assert post(grid, {"model": "m-400", **CHAT}).status_code == 400
    assert post(grid, {"model": "m-400", **CHAT}).status_code == 200


def test_loading_or_draining_engine_never_receives_a_request(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    loading, draining_host = engines("m-gate"), engines("m-gate")
    serve_model(grid, loading, "host-loading", residency_state="loading")
    serve_model(grid, draining_host, "host-draining", state="draining")
    ids = [m["id"] for m in grid.http.get(grid.url + "/v1/models").json()["data"]]
    assert "m-gate" not in ids
    for _ in range(5):
        assert post(grid, {"model": "m-gate", **CHAT}).status_code == 503
    assert loading.requests() == 0 and draining_host.requests() == 0


def test_wrong_engine_key_is_a_502_not_a_leak(grid: Grid, engines: Callable[[str], Engine]) -> None:
    eng = engines("m-key")
    serve_model(grid, eng, "host-1", key="not-the-engine-key")
    r = post(grid, {"model": "m-key", **CHAT})
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_auth"
    assert "not-the-engine-key" not in r.text


def test_a_re_registered_engine_key_is_the_one_relayed(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    # A node that rotated its key registers again: the server relays the newest key only.
    eng = engines("m-rekey")
    token = serve_model(grid, eng, "host-rekey", key="the-key-before-rotation")
    assert post(grid, {"model": "m-rekey", **CHAT}).status_code == 502
    grid.register_engine(token, "host-rekey", eng.model, eng.url, eng.key)
    assert post(grid, {"model": "m-rekey", **CHAT}).status_code == 200
    grid.register_engine(token, "host-rekey", eng.model, eng.url, "an-older-key")
    r = post(grid, {"model": "m-rekey", **CHAT})
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_auth"


def test_affinity_key_keeps_a_session_on_one_engine(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    engs = [engines("m-aff") for _ in range(3)]
    for i, e in enumerate(engs):
        serve_model(grid, e, f"host-{i}", max_concurrency=4)
    for _ in range(6):
        assert (
            post(
                grid, {"model": "m-aff", **CHAT}, headers={AFFINITY_HEADER: "session-42"}
            ).status_code
            == 200
        )
    counts = sorted(e.requests() for e in engs)
    assert counts == [0, 0, 6]


def test_requests_feed_demand_without_prompts(grid: Grid, engines: Callable[[str], Engine]) -> None:
    eng = engines("m-demand")
    grid.http.put(
        grid.url + "/allocator/models/m-demand",
        json={"memory_mb": 1000},
        headers=grid.operator(),
    ).raise_for_status()
    serve_model(grid, eng, "host-1")
    secret_prompt = "my-private-prompt-text-123"
    for _ in range(5):
        body = {"model": "m-demand", "messages": [{"role": "user", "content": secret_prompt}]}
        assert post(grid, body).status_code == 200
    grid.http.post(grid.url + "/allocator/tick", headers=grid.operator()).raise_for_status()
    status = grid.http.get(grid.url + "/allocator/status?detail=1")
    forecast = status.json()["controller"]["forecasts"]["m-demand"]
    assert forecast["request_rate_rps"] > 0
    assert secret_prompt not in status.text


def test_auto_model_goes_to_the_best_scored_ready_model(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    coder, general = engines("m-coder"), engines("m-general")
    op = grid.operator()
    grid.http.put(
        grid.url + "/allocator/models/m-coder",
        headers=op,
        json={"memory_mb": 1000, "workload_scores": {"coding": 1.0, "general": 0.2}},
    ).raise_for_status()
    grid.http.put(
        grid.url + "/allocator/models/m-general",
        headers=op,
        json={"memory_mb": 1000, "workload_scores": {"coding": 0.3, "general": 1.0}},
    ).raise_for_status()
    serve_model(grid, coder, "host-c")
    serve_model(grid, general, "host-g")
    code = {
        "model": "auto",
        "messages": [
            {"role": "user", "content": "please debug this python function, it raises KeyError"}
        ],
    }
    chat = {"model": "auto", "messages": [{"role": "user", "content": "how was your weekend"}]}
    r = post(grid, code)
    assert r.status_code == 200 and r.json()["model"] == "m-coder"
    r = post(grid, chat)
    assert r.status_code == 200 and r.json()["model"] == "m-general"
    assert coder.requests() == 1 and general.requests() == 1


def test_unscored_auto_request_goes_to_the_baseline_not_the_first_model_id(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    """No ready model is scored for the request's workload: the always-on baseline answers,
    not an optional specialist whose id happens to sort first."""
    special, base = engines("a-special"), engines("z-base")
    op = grid.operator()
    for model, extra in (
        ("a-special", {"workload_scores": {"image": 0.9}}),
        ("z-base", {"min_replicas": 1}),
    ):
        grid.http.put(
            f"{grid.url}/allocator/models/{model}",
            headers=op,
            json={"memory_mb": 1000, **extra},
        ).raise_for_status()
    serve_model(grid, special, "host-s")
    serve_model(grid, base, "host-b")
    chat = {"model": "auto", "messages": [{"role": "user", "content": "how was your weekend"}]}
    for _ in range(3):
        r = post(grid, chat)
        assert r.status_code == 200 and r.json()["model"] == "z-base"
    assert special.requests() == 0


def test_auto_model_goes_to_the_allocators_measured_choice_when_it_is_ready(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    """Labelled quality reorders two coding candidates; once the portfolio maps coding to the
    measured leader, ``auto`` coding requests go there although the other ready model has
    the higher configured score (the allocator, not the router, chooses)."""
    favoured, measured = engines("m-favoured"), engines("m-measured")
    op = grid.operator()
    for model, score in (("m-favoured", 0.9), ("m-measured", 0.8)):
        grid.http.put(
            f"{grid.url}/allocator/models/{model}",
            headers=op,
            json={"memory_mb": 1000, "workload_scores": {"coding": score}},
        ).raise_for_status()
    serve_model(grid, favoured, "host-f")
    serve_model(grid, measured, "host-m")
    for model, score in (("m-favoured", 0.1), ("m-measured", 0.9)):
        for _ in range(8):  # full quality confidence
            grid.http.post(
                grid.url + "/allocator/evaluations",
                headers=op,
                json={"model_id": model, "workload": "coding", "score": score},
            ).raise_for_status()
    code = {"model": "auto", "messages": [{"role": "user", "content": "debug this python code"}]}
    for _ in range(3):  # the admission gate's three observations
        r = post(grid, code)
        assert r.status_code == 200 and r.json()["model"] == "m-favoured"  # no choice yet
    grid.http.post(grid.url + "/allocator/tick", headers=op).raise_for_status()
    portfolio = grid.http.get(grid.url + "/allocator/status").json()["controller"]["portfolio"]
    assert portfolio["mapping"] == {"coding": "m-measured"}
    r = post(grid, code)
    assert r.status_code == 200 and r.json()["model"] == "m-measured"
    assert measured.requests() == 1


def test_client_hangup_stops_relaying_a_stream(
    grid_process: Grid, engines: Callable[[str], Engine]
) -> None:
    grid = grid_process  # hanging up needs a real connection to close
    eng = engines("m-hang")
    serve_model(grid, eng, "host-1")
    eng.behave(token_delay_ms=50)  # 4000 tokens would take over three minutes
    with grid.http.stream(
        "POST",
        grid.url + "/v1/chat/completions",
        json={
            "model": "m-hang",
            "stream": True,
            "max_tokens": 4000,
            "messages": [{"role": "user", "content": "go"}],
        },
    ) as r:
        first = next(r.iter_lines())
        assert first.startswith("data: ")

    def inflight() -> int:
        st = grid.http.get(grid.url + "/allocator/status").json()
        return int(st["server"]["inflight_requests"])

    wait_until_sync(lambda: inflight() == 0, timeout_s=30.0)
    assert inflight() == 0


def test_two_5xx_open_the_only_route_without_hiding_the_model(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    eng = engines("m-5xx")
    serve_model(grid, eng, "host-1")
    eng.behave(status=503, count=2)
    assert post(grid, {"model": "m-5xx", **CHAT}).status_code == 503
    assert post(grid, {"model": "m-5xx", **CHAT}).status_code == 503
    refused = post(grid, {"model": "m-5xx", **CHAT})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_not_ready"
    assert eng.requests() == 2  # the open breaker kept the third request off the engine
    ids = [m["id"] for m in grid.http.get(grid.url + "/v1/models").json()["data"]]
    assert ids == ["m-5xx"]


def test_server_timing_reports_the_engine_time_of_each_proxied_response(
    grid: Grid, engines: Callable[[str], Engine]
) -> None:
    """Each relayed answer says how long the engine took (Server-Timing ``upstream;dur=``),
    so a caller can tell Grid's share of its latency from the engine's, request by request."""
    from grid_server.bench_stats import parse_server_timing

    eng = engines("m-timing")
    serve_model(grid, eng, "host-1")
    eng.behave(delay_ms=150)
    r = post(grid, {"model": "m-timing", **CHAT})
    assert r.status_code == 200
    dur = parse_server_timing(r.headers.get("server-timing"))
    assert dur is not None and dur >= 150.0  # the engine held its answer 150 ms
    with grid.http.stream(
        "POST",
        grid.url + "/v1/chat/completions",
        json={"model": "m-timing", "stream": True, **CHAT},
    ) as s:
        assert s.status_code == 200
        streamed = parse_server_timing(s.headers.get("server-timing"))
        s.read()
    assert streamed is not None and streamed >= 150.0
