"""The upstream hop: one shared aiohttp connection pool to the engines.

Why aiohttp: the proxy's hop to an engine is a plain HTTP/1.1 POST on loopback or a LAN, so
the cost that matters is CPU per request and how the pool behaves when many requests wait
for connections at once. Measured on this project's 2-core machine against the FAKE engine
(client process CPU per request, same load, load average ~10):

=================  ==========  ===========  ===========
transport          1 client    32 clients   64 clients
=================  ==========  ===========  ===========
httpx 0.28 pool    862 us      2,148 us     2,314 us
httpx2 2.16 pool   1,036 us    1,070 us     1,443 us
aiohttp 3.14       322 us      159 us       197 us
=================  ==========  ===========  ===========

httpx's pool re-scans every queued request against every connection on each assignment, so
its cost grows with concurrency; aiohttp keeps a per-host queue of idle connections and parses
responses in C. (Script: ``docs/router.md``, "Choosing the upstream client".)

Connection rules kept here (source: issue 16, items 1 and 11):

* an idle connection is kept for :data:`KEEPALIVE_S`, well below llama-server's own 5 s idle
  close, so the pool never hands out a connection the engine is about to close;
* a streamed request asks the engine to close the connection after the stream
  (``Connection: close``): llama-server may announce keep-alive on a stream and close anyway,
  and a POST on such a connection fails with no way to know whether the engine saw it;
* a POST that may have reached an engine is never replayed (the breaker steers later
  requests); only a request whose connection failed before any byte was written
  (:data:`NOTHING_SENT`) is sent to another ready replica by the proxy.
"""

from __future__ import annotations

import socket
from contextlib import AbstractAsyncContextManager
from ssl import SSLContext

import aiohttp
from aiohttp import AddrInfoType

CONNECT_TIMEOUT_S = 5.0
"""Connecting to a loopback or LAN engine takes milliseconds; five seconds means it is gone."""
READ_TIMEOUT_S = 600.0
"""Gap allowed between upstream bytes: a long prompt's prefill on a slow CPU can take minutes."""
POOL_TIMEOUT_S = 30.0
"""Wait for a pooled connection (including connecting) before giving up with 502."""
MAX_CONNECTIONS = 1024
"""Shared pool size: far above one fleet's engines × their slots (admission bounds the rest)."""
KEEPALIVE_S = 2.0
"""Idle connection lifetime. llama-server (cpp-httplib) closes a connection idle for 5 s; a
pooled connection older than that would fail the next POST with a protocol error."""

UNACKED_TIMEOUT_S = 15.0
"""Seconds sent bytes may stay unacknowledged before the kernel aborts the connection
(``TCP_USER_TIMEOUT``): a LAN peer acknowledges in milliseconds even while its engine computes,
so only a cut link or a dead host reaches this; fifteen seconds rides out a brief Wi-Fi roam."""
KEEPALIVE_IDLE_S = 10
"""Idle seconds before the first keepalive probe on an upstream connection."""
KEEPALIVE_INTERVAL_S = 5
"""Seconds between keepalive probes."""
KEEPALIVE_PROBES = 3
"""Unanswered probes before the connection is declared dead (idle + 3 x 5 s = 25 s)."""

UpstreamError = (aiohttp.ClientError, TimeoutError)
"""What a failed upstream exchange raises (transport, protocol, payload or timeout)."""
NOTHING_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
"""Failures that happen before the request's first byte is written: connecting was refused,
reset or timed out, or no pooled connection was granted in time. aiohttp raises these from
the connector only, before it writes the request line, so the engine never saw the request.
(A reused pooled connection that the engine closed fails later, as ServerDisconnectedError,
and stays ambiguous.)"""


def upstream_socket(addr_info: AddrInfoType) -> socket.socket:
    """A socket for one upstream connection that notices a dead peer in seconds (see
    :data:`UNACKED_TIMEOUT_S` and the keepalive bounds); options a platform lacks are skipped."""
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=kind, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    tcp_options = (
        ("TCP_USER_TIMEOUT", int(UNACKED_TIMEOUT_S * 1000)),
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    )
    for name, value in tcp_options:
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    return sock


class UpstreamPool:
    """The proxy's connection pool (one per server process; create it on the running loop).

    Attributes:
        session: the aiohttp session; requests go through :meth:`post`.
    """

    def __init__(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=MAX_CONNECTIONS,
            limit_per_host=0,
            keepalive_timeout=KEEPALIVE_S,
            enable_cleanup_closed=False,
            socket_factory=upstream_socket,
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            # The body is relayed byte for byte and scanned for usage: never decode it.
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            # One session serves every caller: a cookie one engine sets must never ride along
            # on another caller's request (and no jar means no per-request cookie filtering).
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=POOL_TIMEOUT_S,
                sock_connect=CONNECT_TIMEOUT_S,
                sock_read=READ_TIMEOUT_S,
            ),
            trust_env=False,
            raise_for_status=False,
        )

    def post(
        self, url: str, body: bytes, headers: dict[str, str], ssl: SSLContext | bool = True
    ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """Start one POST; use as ``async with pool.post(...) as response``.

        ``ssl`` verifies an ``https://`` engine: the private context built from the CA it
        registered (hostname checked), or ``True`` for the system trust store.

        Raises:
            aiohttp.ClientError / TimeoutError: on entering the context (see :data:`UpstreamError`).
        """
        return self.session.post(url, data=body, headers=headers, allow_redirects=False, ssl=ssl)

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self.session.close()
