"""The one control-API client: credentials never cross plain HTTP off loopback, refusals are
one line with the CLI's exit code, an absent server is named."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from grid_core.client import (
    Calls,
    GridClient,
    PlainHttpRefused,
    RequestRefused,
    ServerUnreachable,
    check_credential_transport,
)
from grid_core.errors import EXIT_RUNTIME_FAILURE, EXIT_USAGE
from grid_server.harness import serve_in_thread
from grid_server.proxy import Receive, Scope, Send


@contextmanager
def answering(status: int, body: bytes) -> Iterator[str]:
    """A real loopback HTTP server answering every request with ``status`` and ``body``;
    yields its URL."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    server = serve_in_thread(app, "answering")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:22100", "http://localhost:1", "http://[::1]:2", "https://10.0.0.5"]
)
def test_credentials_may_go_to_loopback_or_https(url: str) -> None:
    assert check_credential_transport(url) == url


@pytest.mark.parametrize("url", ["http://10.0.0.5:22100", "http://grid.example:80", "ftp://x"])
def test_credentials_never_go_over_plain_http_off_loopback(url: str) -> None:
    with pytest.raises(PlainHttpRefused):
        check_credential_transport(url)
    with GridClient(url, operator_token="secret") as client, pytest.raises(PlainHttpRefused):
        client.tick()  # refused before any connection is attempted


def test_public_calls_need_no_credential() -> None:
    with answering(200, b'{"data": [{"id": "m"}]}') as url, GridClient(url) as client:
        assert client.models() == ["m"]


def test_a_refusal_quotes_the_server_message_and_maps_the_exit_code() -> None:
    body = b'{"error": {"message": "mode: Invalid enum value", "type": "ValidationError"}}'
    with (
        answering(400, body) as url,
        GridClient(url, operator_token="t") as client,
        pytest.raises(RequestRefused) as refused,
    ):
        client.set_mode("fast")
    assert str(refused.value) == "PUT /allocator/mode → 400: mode: Invalid enum value"
    assert refused.value.exit_code == EXIT_USAGE
    with (
        answering(401, b"no") as url,
        GridClient(url, operator_token="t") as client,
        pytest.raises(RequestRefused) as refused,
    ):
        client.tick()
    assert refused.value.exit_code == EXIT_RUNTIME_FAILURE and refused.value.message == "no"


def test_an_answer_outside_the_contract_is_refused_not_trusted() -> None:
    with (
        answering(200, b"[1]") as url,
        GridClient(url, operator_token="t") as client,
        pytest.raises(RequestRefused, match="does not match the contract"),
    ):
        client.issue_node_credential("h1")


def test_no_server_is_one_line_naming_the_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}"
    with GridClient(url, timeout=5.0) as client, pytest.raises(ServerUnreachable, match=url):
        client.status()


def test_model_ids_are_one_path_segment() -> None:
    assert Calls.get_model("a/b c").path == "/allocator/models/a%2Fb%20c"
