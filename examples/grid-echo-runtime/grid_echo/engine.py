"""The echo engine: a minimal OpenAI-compatible server (a stand-in for a real engine).

``python -m grid_echo.engine --alias NAME --host 127.0.0.1 --port N --api-key-file PATH
--model PATH``. ``/health`` is open; ``/v1/models``, ``/v1/chat/completions`` and ``/activity``
need ``Authorization: Bearer <key>`` with a key from the file. Chat completions answer with the
last user message; ``/activity`` reports requests in flight.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MAX_BODY_BYTES = 1024 * 1024
"""Largest request body accepted: an echo needs no more, and a bound keeps memory flat."""


def serve(alias: str, host: str, port: int, keys: frozenset[str]) -> None:
    """Serve until the process is stopped (SIGTERM ends it)."""
    active = 0
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet log
            return

        def _send(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if token in keys:
                return True
            self._send(401, {"error": {"message": "invalid api key"}})
            return False

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/v1/models" and self._authorized():
                self._send(200, {"object": "list", "data": [{"id": alias, "object": "model"}]})
            elif self.path == "/activity" and self._authorized():
                self._send(200, {"active": active})
            elif self.path not in ("/v1/models", "/activity"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            nonlocal active
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            if not self._authorized():
                return
            length = int(self.headers.get("Content-Length", "0"))
            if length > MAX_BODY_BYTES:
                self._send(413, {"error": {"message": "request body too large"}})
                return
            with lock:
                active += 1
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                users = [m for m in body.get("messages", []) if m.get("role") == "user"]
                text = str(users[-1].get("content", "")) if users else ""
                words = len(text.split())
                self._send(
                    200,
                    {
                        "id": f"echo-{time.time_ns()}",
                        "object": "chat.completion",
                        "model": alias,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {
                            "prompt_tokens": words,
                            "completion_tokens": words,
                            "total_tokens": 2 * words,
                        },
                    },
                )
            finally:
                with lock:
                    active -= 1

    ThreadingHTTPServer((host, port), Handler).serve_forever()


def main() -> None:
    """Parse the command line and serve."""
    parser = argparse.ArgumentParser(prog="grid_echo.engine")
    parser.add_argument("--alias", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key-file", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True)
    args = parser.parse_args()
    keys = frozenset(k.strip() for k in args.api_key_file.read_text().splitlines() if k.strip())
    serve(args.alias, args.host, args.port, keys)


if __name__ == "__main__":
    main()
