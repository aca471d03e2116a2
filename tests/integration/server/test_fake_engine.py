"""The FAKE engine speaks the llama-server shape the proxy depends on (so tests mean something)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from server_testbed import Engine

pytestmark = pytest.mark.integration


def test_fake_engine_protocol(engines: Callable[[str], Engine]) -> None:
    eng = engines("fake-m")
    auth = {"authorization": f"Bearer {eng.key}"}
    with httpx.Client(trust_env=False) as http:
        assert http.get(eng.url + "/health").json() == {"status": "ok"}  # public
        assert http.get(eng.url + "/v1/models").json()["data"][0]["id"] == "fake-m"
        chat = {"model": "fake-m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        denied = http.post(eng.url + "/v1/chat/completions", json=chat)
        assert denied.status_code == 401
        assert denied.json()["error"]["type"] == "authentication_error"
        wrong = http.post(
            eng.url + "/v1/chat/completions", json=chat, headers={"authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401
        ok = http.post(eng.url + "/v1/chat/completions", json=chat, headers=auth).json()
        assert ok["usage"] == {"completion_tokens": 2, "prompt_tokens": 4, "total_tokens": 6}
        with http.stream(
            "POST", eng.url + "/v1/chat/completions", headers=auth, json={**chat, "stream": True}
        ) as r:
            assert r.headers["content-type"] == "text/event-stream"
            events = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        usage = json.loads(events[-2])
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2
        finish = json.loads(events[-3])
        assert finish["choices"][0]["finish_reason"] == "length"
