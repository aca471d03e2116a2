"""The node's TLS front of an engine: nothing without the engine key, TLS only, streams relayed
as they are produced, and a caller that goes away stops the engine's work.

The engine behind the front is a FAKE (a small aiohttp app on loopback, clearly named) whose
stream waits for the test's go-ahead between chunks, so "unbuffered" and "cancelled" are
observed, not timed.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import anyio
import pytest
from aiohttp import web
from tlsfiles import make_ca

from grid_node.engine_tls import EngineFront, load_engine_tls
from grid_server.registry import engine_ssl_context

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

KEY = "engine-key-for-this-test-only"
WAIT_S = 30.0
"""Bound for each awaited event on a loaded machine (never asserted as a time)."""


@dataclass
class FakeEngine:
    """A FAKE loopback engine: counts requests, streams two chunks on the test's signal."""

    seen: list[str] = field(default_factory=list)
    go: asyncio.Event = field(default_factory=asyncio.Event)
    caller_gone: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(f"{request.method} {request.path} {request.headers.get('Authorization')}")
        if request.path != "/v1/chat/completions":
            return web.json_response({"status": "ok"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"chunk": 1}\n\n')
        try:
            await self.go.wait()
            for _ in range(200):  # keeps writing until the relay's connection is gone
                await resp.write(b'data: {"chunk": 2}\n\n')
                await asyncio.sleep(0.05)
        except (ConnectionResetError, asyncio.CancelledError):
            self.caller_gone.set()
            raise
        return resp


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[tuple[EngineFront, FakeEngine, ssl.SSLContext]]:
    engine = FakeEngine()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", engine.handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    upstream = f"http://127.0.0.1:{runner.addresses[0][1]}"
    ca = make_ca(tmp_path)
    cert, key = ca.issue(tmp_path, "engine", ["127.0.0.1", "::1"])
    tls = load_engine_tls("127.0.0.1", cert, key, ca.cert_path)
    fr = EngineFront(upstream=upstream, key=KEY)
    await fr.start(tls, "127.0.0.1", 0)
    assert tls.ca_pem is not None
    try:
        yield fr, engine, engine_ssl_context(tls.ca_pem)
    finally:
        await fr.stop()
        await runner.cleanup()


async def test_engine_port_without_the_key_serves_nothing(front) -> None:
    fr, engine, verify = front
    async with aiohttp.ClientSession() as s:
        for method, path in (
            ("GET", "/health"),
            ("GET", "/v1/models"),
            ("GET", "/slots"),
            ("POST", "/v1/chat/completions"),
        ):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                async with s.request(method, fr.url + path, headers=headers, ssl=verify) as r:
                    assert r.status == 401, (method, path, headers)
                    assert (await r.json())["error"]["type"] == "authentication_error"
    assert engine.seen == []  # nothing reached the engine


async def test_plain_http_to_the_engine_port_is_refused(front) -> None:
    fr, engine, _ = front
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.get(
                f"http://127.0.0.1:{fr.port}/health", headers={"Authorization": f"Bearer {KEY}"}
            ) as r:
                await r.read()
    assert engine.seen == []


async def test_a_name_the_certificate_does_not_cover_is_refused(front) -> None:
    fr, engine, verify = front
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with s.get(
                f"https://localhost:{fr.port}/health",
                headers={"Authorization": f"Bearer {KEY}"},
                ssl=verify,
            ):
                pass
    assert engine.seen == []


async def test_keyed_request_is_relayed_with_its_key(front) -> None:
    fr, engine, verify = front
    async with (
        aiohttp.ClientSession() as s,
        s.get(
            fr.url + "/v1/models?x=1", headers={"Authorization": f"Bearer {KEY}"}, ssl=verify
        ) as r,
    ):
        assert r.status == 200 and (await r.json()) == {"status": "ok"}
    assert engine.seen == [f"GET /v1/models Bearer {KEY}"]


async def test_stream_is_unbuffered_and_a_gone_caller_stops_the_engine(front) -> None:
    fr, engine, verify = front
    async with aiohttp.ClientSession() as s:
        r = await s.post(
            fr.url + "/v1/chat/completions",
            json={"stream": True},
            headers={"Authorization": f"Bearer {KEY}"},
            ssl=verify,
        )
        assert r.status == 200
        with anyio.fail_after(WAIT_S):
            first = await r.content.readuntil(b"\n\n")
        # The engine has produced only its first chunk (it waits for `go`): the front passed
        # it on without waiting for more.
        assert first == b'data: {"chunk": 1}\n\n'
        assert not engine.go.is_set()
        engine.go.set()
        with anyio.fail_after(WAIT_S):
            assert await r.content.readuntil(b"\n\n") == b'data: {"chunk": 2}\n\n'
        r.close()  # the caller goes away mid-stream
    with anyio.fail_after(WAIT_S):
        await engine.caller_gone.wait()


async def test_ipv6_front(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    cert, key = ca.issue(tmp_path, "engine6", ["::1"])
    tls = load_engine_tls("::1", cert, key, ca.cert_path)
    engine = FakeEngine()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", engine.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fr = EngineFront(upstream=f"http://127.0.0.1:{runner.addresses[0][1]}", key=KEY)
    try:
        await fr.start(tls, "::1", 0)
        assert fr.url.startswith("https://[::1]:")
        assert tls.ca_pem is not None
        async with (
            aiohttp.ClientSession() as s,
            s.get(
                fr.url + "/health",
                headers={"Authorization": f"Bearer {KEY}"},
                ssl=engine_ssl_context(tls.ca_pem),
            ) as r,
        ):
            assert r.status == 200
    finally:
        await fr.stop()
        await runner.cleanup()
