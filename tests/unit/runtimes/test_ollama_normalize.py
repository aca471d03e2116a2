"""Ollama request normalisation: no caller field can unload or reload a placed model."""

from __future__ import annotations

import pytest
from grid_comfyui.adapter import ComfyUIAdapter
from grid_ollama.adapter import OllamaAdapter
from grid_ollama.normalize import PINNED_KEEP_ALIVE, RELOAD_OPTIONS, normalize
from hypothesis import given
from hypothesis import strategies as st

from grid_core.errors import ValidationError

values = st.one_of(st.integers(-5, 100_000), st.text(max_size=5), st.none(), st.booleans())


@given(
    keep_alive=values,
    options=st.dictionaries(st.sampled_from([*RELOAD_OPTIONS, "temperature", "seed"]), values),
    top_num_ctx=st.one_of(st.none(), st.integers(1, 100_000)),
)
def test_every_request_reaches_ollama_pinned(keep_alive, options, top_num_ctx) -> None:
    body = {"model": "alias", "messages": [], "keep_alive": keep_alive, "options": options}
    if top_num_ctx is not None:
        body["num_ctx"] = top_num_ctx
    out, _ = normalize(body, model="qwen:1b", num_ctx=4096)
    assert out["keep_alive"] == PINNED_KEEP_ALIVE
    assert out["model"] == "qwen:1b"
    assert "num_ctx" not in out
    assert out["options"]["num_ctx"] == 4096
    assert not set(out["options"]) & (set(RELOAD_OPTIONS) - {"num_ctx"})
    # Sampling options are the caller's to choose and pass through untouched.
    for key in ("temperature", "seed"):
        if key in options:
            assert out["options"][key] == options[key]
    assert body["keep_alive"] == keep_alive  # the caller's body is not modified


def test_overridden_fields_are_named() -> None:
    _, overridden = normalize(
        {"keep_alive": 0, "num_ctx": 1, "options": {"num_ctx": 2, "num_gpu": 1}},
        model="m",
        num_ctx=4096,
    )
    assert overridden == ["keep_alive", "num_ctx", "options.num_ctx", "options.num_gpu"]


@pytest.mark.parametrize(
    ("adapter", "port", "env"),
    [(OllamaAdapter, 11434, "GRID_OLLAMA_URL"), (ComfyUIAdapter, 8188, "GRID_COMFYUI_URL")],
)
def test_gateway_services_must_listen_on_loopback(adapter: type, port: int, env: str) -> None:
    # Neither service authenticates: only its Grid gateway may be reachable off the host.
    assert adapter(f"http://127.0.0.1:{port}/").url == f"http://127.0.0.1:{port}"
    assert adapter(f"http://[::1]:{port}").url == f"http://[::1]:{port}"
    with pytest.raises(ValidationError, match=f"{env}=.*must listen on loopback"):
        _ = adapter(f"http://10.0.0.5:{port}").url
