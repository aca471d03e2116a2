"""Engines reachable from the server: a TLS front per engine, run by the node agent.

Why the node terminates TLS instead of llama-server: the cached llama-server is built without
SSL support and a rebuild costs about an hour per machine; every other runtime plugin would need
its own TLS story too. So each Grid-owned engine keeps listening on ``127.0.0.1`` only, and the
agent opens one TLS listener per engine on the advertised address that

* refuses every request that does not carry the host's engine key (``Authorization: Bearer``),
  health checks included, so a LAN client cannot start work on an engine behind the router's
  back (specification, "Managed host actuator": the engine key fences the child port);
* relays the request to the loopback engine and the answer back chunk by chunk as it arrives
  (a token stream is never buffered);
* closes the loopback connection as soon as the caller goes away, which is how llama-server
  learns to stop generating (a cancelled request frees its slot).

The server's upstream client verifies the front against the CA the node sends with its engine
registration, hostname included (see ``grid_server.registry``). The certificate must be issued
for the exact advertised host name or IP, its key must be owner-only, and the listener's
address family follows the advertised address (IPv4 or IPv6).
"""

from __future__ import annotations

import contextlib
import datetime
import hmac
import ipaddress
import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtensionOID

from grid_core.errors import UnavailableError, ValidationError
from grid_core.tls import check_private_key_file

MAX_CA_BYTES = 64 * 1024
"""Largest CA bundle a node sends with an engine registration: a private intranet chain is a
few KB; the server refuses more (``grid_core.wire.MAX_ENGINE_CA_PEM``)."""
UPSTREAM_CONNECT_TIMEOUT_S = 5.0
"""Connecting to the loopback engine takes well under a millisecond; five seconds means it is
gone (the caller then gets 502 and the server's breaker steers away)."""
UPSTREAM_READ_TIMEOUT_S = 600.0
"""Gap allowed between engine bytes: the same bound as the server's own upstream hop."""
MAX_REQUEST_BYTES = 32 * 1024 * 1024
"""Largest request body relayed: the server's own proxy limit for one OpenAI request."""
FRONT_KEEPALIVE_S = 75.0
"""Idle TLS connections from the server stay open this long (aiohttp's default): the
handshake is paid once per pooled connection, not per request."""
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
"""Headers that describe one connection, not the message (RFC 9110 section 7.6.1)."""


# --- certificate checks ---------------------------------------------------------------------
def _first_cert(path: Path, flag: str) -> x509.Certificate:
    try:
        certs = x509.load_pem_x509_certificates(path.read_bytes())
    except OSError as exc:
        msg = f"{flag} {path}: cannot read ({exc.strerror})"
        raise ValidationError(msg) from None
    except ValueError:
        msg = f"{flag} {path}: not a PEM certificate chain"
        raise ValidationError(msg) from None
    return certs[0]


def san_covers(cert: x509.Certificate, host: str) -> bool:
    """Whether ``cert``'s subjectAltName covers ``host`` (an IP literal or a DNS name).

    An IP must appear as an IP entry; a name as a DNS entry, a leading ``*.`` matching exactly
    one label (RFC 6125 section 6.4.3). The subject CN is never used (RFC 2818).
    """
    try:
        san = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    except x509.ExtensionNotFound:
        return False
    assert isinstance(san, x509.SubjectAlternativeName)
    bare = host.strip("[]").split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        ip = None
    if ip is not None:
        return ip in san.get_values_for_type(x509.IPAddress)
    name = bare.lower().rstrip(".")
    for entry in san.get_values_for_type(x509.DNSName):
        pattern = entry.lower().rstrip(".")
        if pattern == name:
            return True
        if pattern.startswith("*.") and "." in name and name.split(".", 1)[1] == pattern[2:]:
            return True
    return False


def _issued_by_one_of(cert: x509.Certificate, cas: Iterable[x509.Certificate]) -> bool:
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


@dataclass(frozen=True)
class EngineTls:
    """The engine TLS material of one node, checked.

    Attributes:
        advertise_host: the host name or IP the server reaches this node's engines at.
        context: the listener's server-side TLS context (certificate chain and key loaded).
        ca_pem: the CA bundle the server verifies the engines with (sent with each engine
            registration; ``None`` = the server's system trust store).
    """

    advertise_host: str
    context: ssl.SSLContext
    ca_pem: str | None


def load_engine_tls(
    advertise_host: str,
    cert: Path,
    key: Path,
    ca: Path | None,
    *,
    now: datetime.datetime | None = None,
) -> EngineTls:
    """Check the engine certificate, key and CA, and build the listener's TLS context.

    Args:
        advertise_host: the address the certificate must cover.
        cert: PEM chain, leaf first (``--engine-tls-cert``).
        key: the leaf's private key, owner-only (``--engine-tls-key``).
        ca: the private CA bundle (``--engine-tls-ca``); the leaf or its first intermediate
            must be issued by one of its certificates.
        now: the instant validity is checked at (default: now, UTC).

    Raises:
        TlsError: the key file is missing or readable by others (``chmod 600`` is named).
        ValidationError: one line naming the flag and the problem: unreadable, not PEM,
            expired or not yet valid, the SAN does not cover ``advertise_host``, not issued by
            the CA, or the key does not match.
    """
    now = now or datetime.datetime.now(datetime.UTC)
    check_private_key_file(key, "--engine-tls-key")
    leaf = _first_cert(cert, "--engine-tls-cert")
    if leaf.not_valid_after_utc <= now:
        msg = f"--engine-tls-cert {cert}: expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        raise ValidationError(msg)
    if leaf.not_valid_before_utc > now:
        msg = f"--engine-tls-cert {cert}: not valid before {leaf.not_valid_before_utc:%Y-%m-%d}"
        raise ValidationError(msg)
    if not san_covers(leaf, advertise_host):
        msg = (
            f"--engine-tls-cert {cert}: its subjectAltName does not cover the advertised host "
            f"{advertise_host!r}; issue a certificate for that exact name or IP"
        )
        raise ValidationError(msg)
    ca_pem: str | None = None
    if ca is not None:
        try:
            raw = ca.read_bytes()
        except OSError as exc:
            msg = f"--engine-tls-ca {ca}: cannot read ({exc.strerror})"
            raise ValidationError(msg) from None
        if len(raw) > MAX_CA_BYTES:
            msg = f"--engine-tls-ca {ca}: {len(raw)} bytes; at most {MAX_CA_BYTES} are sent"
            raise ValidationError(msg)
        try:
            cas = x509.load_pem_x509_certificates(raw)
        except ValueError:
            msg = f"--engine-tls-ca {ca}: not a PEM certificate bundle"
            raise ValidationError(msg) from None
        chain = x509.load_pem_x509_certificates(cert.read_bytes())
        # The leaf must be issued by a CA of the bundle, or by an intermediate of its own
        # chain that one of them issued (a chain file may also carry the CA itself).
        issuers = [*cas, *(c for c in chain[1:] if _issued_by_one_of(c, cas))]
        if not _issued_by_one_of(leaf, issuers):
            msg = (
                f"--engine-tls-cert {cert}: not issued by a certificate in --engine-tls-ca {ca}; "
                "the server would refuse the engine"
            )
            raise ValidationError(msg)
        ca_pem = raw.decode("ascii", errors="strict")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        msg = f"--engine-tls-key {key}: does not match --engine-tls-cert {cert} ({exc})"
        raise ValidationError(msg) from None
    return EngineTls(advertise_host=advertise_host, context=context, ca_pem=ca_pem)


# --- addresses ------------------------------------------------------------------------------
def listen_address(advertise_host: str) -> tuple[str, socket.AddressFamily]:
    """Where a front listens for ``advertise_host``, and the address family.

    An IP literal is bound exactly (only that interface is reachable); a host name is resolved
    once to learn its family and the front binds that family's wildcard (``0.0.0.0`` or
    ``::``), since the name may resolve to an address this machine sees through NAT.

    Raises:
        ValidationError: the name does not resolve.
    """
    bare = advertise_host.strip("[]")
    try:
        ip = ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        ip = None
    if ip is not None:
        return bare, socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        infos = socket.getaddrinfo(bare, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        msg = f"--advertise-host {advertise_host!r}: does not resolve ({exc.strerror})"
        raise ValidationError(msg) from None
    family = socket.AddressFamily(infos[0][0])
    return ("::" if family == socket.AF_INET6 else "0.0.0.0"), family


def engine_url(advertise_host: str, port: int) -> str:
    """``https://host:port`` with an IPv6 literal in brackets (its zone escaped, RFC 6874)."""
    bare = advertise_host.strip("[]")
    if ":" in bare:
        return f"https://[{bare.replace('%', '%25')}]:{port}"
    return f"https://{bare}:{port}"


# --- the front ------------------------------------------------------------------------------
def _unauthorized() -> web.Response:
    return web.json_response(
        {
            "error": {
                "message": "this engine port serves only Grid's router (engine key required)",
                "type": "authentication_error",
            }
        },
        status=401,
    )


@dataclass
class EngineFront:
    """One TLS listener relaying keyed requests to one loopback engine.

    Attributes:
        upstream: the engine's loopback base URL, e.g. ``http://127.0.0.1:22201``.
        key: the engine key every request must carry.
        url: the advertised ``https://host:port`` once started.
        port: the listening port once started.
    """

    upstream: str
    key: str
    url: str = ""
    port: int = 0
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    async def start(self, tls: EngineTls, bind: str, port: int) -> None:
        """Listen on ``bind:port`` with TLS.

        Raises:
            OSError: the port is taken (the caller tries the next one).
        """
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # The handler is cancelled when the caller disconnects, which closes the loopback
        # connection and so tells the engine to stop the request.
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, keepalive_timeout=FRONT_KEEPALIVE_S
        )
        await runner.setup()
        site = web.TCPSite(runner, bind, port, ssl_context=tls.context, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        self._session = aiohttp.ClientSession(
            # A fresh loopback connection per request: llama-server closes idle connections
            # after 5 s, and a reused one it is closing would fail the request.
            connector=aiohttp.TCPConnector(force_close=True, limit=0),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(
                total=None,
                sock_connect=UPSTREAM_CONNECT_TIMEOUT_S,
                sock_read=UPSTREAM_READ_TIMEOUT_S,
            ),
            trust_env=False,
        )
        # Port 0 asks the kernel for a free one: report the port really bound.
        self.port = int(runner.addresses[0][1])
        self.url = engine_url(tls.advertise_host, self.port)

    def _authorized(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        return hmac.compare_digest(token.strip().encode(), self.key.encode())

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return _unauthorized()
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        try:
            async with self._session.request(
                request.method,
                self.upstream + request.rel_url.raw_path_qs,
                headers=headers,
                data=body if body else None,
                allow_redirects=False,
            ) as up:
                out = web.StreamResponse(status=up.status, reason=up.reason)
                for name, value in up.headers.items():
                    if name.lower() not in HOP_BY_HOP:
                        out.headers.add(name, value)
                await out.prepare(request)
                async for chunk in up.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except (aiohttp.ClientError, TimeoutError):
            return web.json_response(
                {
                    "error": {
                        "message": "the engine behind this port is not answering",
                        "type": "upstream_unreachable",
                    }
                },
                status=502,
            )

    async def stop(self) -> None:
        """Close the listener and the loopback connections (running relays end)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None


@dataclass
class EngineFronts:
    """The node's fronts, one per engine child (by model id).

    Args:
        tls: the checked TLS material.
        key: the host's engine key.
        port_range: inclusive managed port range the fronts take ports from.
        used_ports: ports engine children hold (never handed to a front).
    """

    tls: EngineTls
    key: str
    port_range: tuple[int, int]
    used_ports: Callable[[], set[int]]
    fronts: dict[str, EngineFront] = field(default_factory=dict)

    def ports(self) -> set[int]:
        """Ports held by fronts (the runtime host never gives them to an engine)."""
        return {f.port for f in self.fronts.values()}

    def url_for(self, model_id: str, upstream: str) -> str | None:
        """The advertised URL of ``model_id``'s front if it runs for ``upstream``."""
        front = self.fronts.get(model_id)
        return front.url if front is not None and front.upstream == upstream else None

    async def ensure(self, model_id: str, upstream: str) -> str:
        """Start (or keep) the front of ``model_id`` relaying to ``upstream``; its URL.

        Raises:
            UnavailableError: no port of the managed range can be bound on the advertised
                address.
        """
        front = self.fronts.get(model_id)
        if front is not None and front.upstream == upstream:
            return front.url
        if front is not None:
            await self.stop(model_id)
        bind, _family = listen_address(self.tls.advertise_host)
        taken = self.used_ports() | self.ports()
        lo, hi = self.port_range
        for port in range(lo, hi + 1):
            if port in taken:
                continue
            front = EngineFront(upstream=upstream, key=self.key)
            try:
                await front.start(self.tls, bind, port)
            except OSError:
                continue
            self.fronts[model_id] = front
            return front.url
        msg = f"no free port in the managed range {lo}-{hi} on {bind} for a TLS front"
        raise UnavailableError(msg)

    async def stop(self, model_id: str) -> None:
        """Stop the front of ``model_id`` (nothing if none runs)."""
        front = self.fronts.pop(model_id, None)
        if front is not None:
            await front.stop()

    async def retain(self, keep: dict[str, str]) -> None:
        """Stop every front whose model is not in ``keep`` (model id → upstream URL) or whose
        engine changed."""
        for model_id in list(self.fronts):
            if self.fronts[model_id].upstream != keep.get(model_id):
                await self.stop(model_id)

    async def aclose(self) -> None:
        """Stop every front."""
        for model_id in list(self.fronts):
            with contextlib.suppress(OSError):
                await self.stop(model_id)


# --- a standalone front (benchmarks) --------------------------------------------------------
def _main(argv: list[str] | None = None) -> None:
    """Run one front as its own process: ``python -m grid_node.engine_tls``.

    ``grid bench proxy --tls`` uses it to put a front in another network namespace than the
    server. The engine key is read from ``--key-file`` (never argv); the front's URL is written
    to ``--url-file`` once it listens. Stops on SIGTERM or SIGINT.
    """
    import argparse
    import asyncio
    import signal

    from grid_core.system import write_atomic

    p = argparse.ArgumentParser(prog="python -m grid_node.engine_tls")
    p.add_argument("--upstream", required=True, help="loopback engine URL")
    p.add_argument("--advertise-host", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--cert", type=Path, required=True)
    p.add_argument("--key", type=Path, required=True)
    p.add_argument("--ca", type=Path)
    p.add_argument("--key-file", type=Path, required=True, help="file holding the engine key")
    p.add_argument("--url-file", type=Path, required=True)
    args = p.parse_args(argv)

    async def run() -> None:
        tls = load_engine_tls(args.advertise_host, args.cert, args.key, args.ca)
        front = EngineFront(upstream=args.upstream, key=args.key_file.read_text().strip())
        bind, _ = listen_address(args.advertise_host)
        await front.start(tls, bind, args.port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        write_atomic(args.url_file, front.url, mode=0o600)
        try:
            await stop.wait()
        finally:
            await front.stop()

    asyncio.run(run())


if __name__ == "__main__":
    _main()
