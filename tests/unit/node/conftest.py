"""Fixtures for node tests: a real loopback HTTP artifact server."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import pytest
from loopback_http import serving


@dataclass
class ArtifactServer:
    """Serves ``files[path] = bytes`` under /owner/repo/resolve/main/<path> with Range support.

    ``cut_after[path] = n`` makes the next response for that path stop after n body bytes
    (connection closed mid-transfer); ``hide_length`` omits Content-Length.
    """

    files: dict[str, bytes] = field(default_factory=dict)
    cut_after: dict[str, int] = field(default_factory=dict)
    hide_length: set[str] = field(default_factory=set)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    bytes_sent: int = 0
    url: str = ""


@pytest.fixture
def artifact_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ArtifactServer]:
    state = ArtifactServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            prefix = "/owner/repo/resolve/main/"
            path = self.path[len(prefix) :] if self.path.startswith(prefix) else None
            rng = self.headers.get("Range")
            state.requests.append((self.path, rng))
            if path not in state.files:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = state.files[path]
            start = 0
            if rng and rng.startswith("bytes="):
                start = int(rng[6:].split("-")[0])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            if path in state.hide_length:
                self.send_header("Connection", "close")
            else:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            cut = state.cut_after.pop(path, None)
            if cut is not None:
                body = body[:cut]
                self.close_connection = True
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client rejected the stream mid-way
                return
            state.bytes_sent += len(body)
            if cut is not None or path in state.hide_length:
                self.close_connection = True

    with serving(Handler) as url:
        state.url = url
        monkeypatch.setenv("GRID_HF_ENDPOINT", url)
        yield state
