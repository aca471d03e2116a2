"""One typed client for the Grid server's control API: operator, node and discovery routes.

The CLI, the logical fleet, the node agent and the tests all talk to a server through this
module, so the credential headers, the plain-HTTP refusal, the decoding of answers and the
one-line error for a refused request exist once.

Shape (sans I/O, like httpx's own layering): each route is a :class:`Call` built by a
function of :class:`Calls` (method, path, encoded body, which credential, and the type the
answer decodes to). :class:`GridClient` sends calls with a blocking ``httpx.Client`` (CLI,
fleet, tests); :class:`AsyncGridClient` sends the same calls with ``httpx.AsyncClient`` (the
node agent's event loop). Either accepts an already built httpx client, which is how tests
drive the server in process (Litestar's test client or ``httpx.ASGITransport``).

Layering: this is an edge module of ``grid_core`` (it opens sockets). Decision modules never
import it; ``grid_server``, ``grid_node`` and plugins do (plugins through the public API).
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote, urlsplit

import httpx
import msgspec

from grid_core.bodies import (
    JOIN_HEADER,
    ClientKeyBody,
    ClientKeyIssued,
    EvaluationBody,
    JoinTokenBody,
    JoinTokenIssued,
    ModeBody,
    NodeCredential,
    ObservationBatch,
    Registered,
    TokenBody,
)
from grid_core.errors import EXIT_RUNTIME_FAILURE, EXIT_USAGE, GridError
from grid_core.tls import TlsRefused, client_context, describe_tls_failure
from grid_core.wire import (
    CONTROL_HEADER,
    OPERATOR_HEADER,
    Heartbeat,
    HeartbeatResponse,
    NodeRegistration,
    WireError,
    decode,
)

T = TypeVar("T")

CONTROL_TIMEOUT_S = 30.0
"""One control request: a tick on a large fleet or a status with detail takes well under this."""

OPERATOR_INPUT_STATUSES = frozenset({400, 404, 409, 413, 422})
"""Refusals caused by what the operator sent (bad value, unknown name, conflict, too large):
the CLI exits 2 for these. Credential refusals (401/403), an unreachable server and 5xx are
environment or remote failures and exit 1 (see docs/operations.md, "Exit codes")."""

MAX_ERROR_TEXT = 300
"""Characters of a non-JSON error body quoted in a refusal message (one readable line)."""

Credential = Literal["operator", "node", "join"]


def exit_code_for(status: int) -> int:
    """The CLI exit code for an HTTP error ``status`` (2 operator input, 1 otherwise)."""
    return EXIT_USAGE if status in OPERATOR_INPUT_STATUSES else EXIT_RUNTIME_FAILURE


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class RequestRefused(GridError):
    """The server answered a call with an error status.

    Attributes:
        status: the HTTP status of the answer.
        message: the server's own error message (or the start of its body).
        http_status: same as ``status``, so a refusal relayed by the CLI keeps its meaning.
        exit_code: 2 for operator input (:data:`OPERATOR_INPUT_STATUSES`), else 1.
    """

    def __init__(
        self,
        method: str,
        path: str,
        status: int,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{method} {path} → {status}: {message}")
        self.status = status
        self.message = message
        self.details = details
        """The error body's ``details`` (e.g. both versions of a 409), if any."""
        self.http_status = status
        self.exit_code = exit_code_for(status)


class ServerUnreachable(GridError):
    """No answer from the server (connection refused, timeout, broken connection)."""

    http_status = 503


class PlainHttpRefused(GridError):
    """A credential would travel over plain HTTP to a host that is not loopback."""

    http_status = 400
    exit_code = EXIT_USAGE


def check_credential_transport(url: str, what: str = "credential") -> str:
    """Refuse a base URL over which a credential would cross the network in clear text.

    Plain HTTP is accepted only to a loopback host; anything else needs HTTPS
    (specification, "CLI workflow": credentials never cross the network unencrypted).

    Args:
        url: the server's base URL.
        what: what would be sent, for the message (``node credential``, ``operator token``).

    Returns:
        ``url`` unchanged.

    Raises:
        PlainHttpRefused: not http(s), no host, or plain HTTP off loopback.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        msg = f"grid URL {url!r}: give http(s)://host:port, e.g. http://127.0.0.1:22100"
        raise PlainHttpRefused(msg)
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        msg = f"refusing to send the {what} to {url} over plain HTTP off loopback; use https://"
        raise PlainHttpRefused(msg)
    return url


def plain_http_refusal(scheme: str, peer_host: str | None) -> str | None:
    """The server side of :func:`check_credential_transport`: why a credential that arrived
    over ``scheme`` from ``peer_host`` must be refused, or ``None`` when it may be used.

    A credential sent over plain HTTP from a host that is not loopback crossed the network in
    clear text; the server refuses it so such a setup never works by accident.
    """
    if scheme == "https" or (peer_host is not None and is_loopback_host(peer_host)):
        return None
    return (
        f"credential refused: it arrived over plain HTTP from {peer_host or 'an unknown peer'} "
        "(off loopback); serve Grid over HTTPS (grid up --tls-cert/--tls-key) and use https://"
    )


Verify = ssl.SSLContext | bool
"""What httpx verifies a server with: a context (a given CA) or the system default."""


def fetch_pinned_ca(url: str, sha256: str, timeout: float = CONTROL_TIMEOUT_S) -> bytes:
    """The CA certificate an ``https://`` Grid serves at ``/tls/ca.pem``, accepted only if its
    SHA-256 equals the pinned fingerprint (the way a join token carries trust).

    This is the one request made without verifying the server: nothing secret is sent, and
    the answer is trusted only because its fingerprint matches the pin; every later request
    verifies the server against the CA returned here.

    Raises:
        TlsRefused: the served CA does not match the pin (or none is served).
        ServerUnreachable: no answer at ``url``.
    """
    from grid_core.tls import ca_fingerprint, normalize_fingerprint

    want = normalize_fingerprint(sha256)
    try:
        with httpx.Client(timeout=timeout, trust_env=False, verify=False) as http:
            resp = http.get(url.rstrip("/") + "/tls/ca.pem")
    except httpx.HTTPError as exc:
        msg = f"no Grid server answered at {url} ({type(exc).__name__})"
        raise ServerUnreachable(msg) from None
    if resp.status_code != 200:
        msg = (
            f"{url} serves no CA certificate (GET /tls/ca.pem → {resp.status_code}); "
            "was it started with --tls-ca?"
        )
        raise TlsRefused(msg)
    try:
        got = ca_fingerprint(resp.content)
    except GridError:
        got = "none"
    if got != want:
        msg = (
            f"the CA served by {url} (sha256:{got[:16]}…) is not the one the join token pins "
            f"(sha256:{want[:16]}…): refusing to trust it (wrong server, or intercepted)"
        )
        raise TlsRefused(msg)
    return resp.content


def tls_verify(ca_file: Path | str | None) -> Verify:
    """The ``verify`` argument for httpx: ``ca_file`` as the trust anchor, else the system store.

    Raises:
        TlsError: ``ca_file`` cannot be loaded.
    """
    return True if ca_file is None else client_context(os.fspath(ca_file))


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request to the server and the type its answer decodes to.

    Attributes:
        method: HTTP method.
        path: path below the base URL (already percent-encoded).
        result: the answer's type (a msgspec Struct, or ``dict`` for free-form documents).
        body: the encoded JSON body, if any.
        credential: which credential the route needs (``None``: public).
        params: query parameters.
        headers: extra request headers (e.g. ``If-Match`` on a conditional profile write).
    """

    method: str
    path: str
    result: type[T]
    body: bytes | None = None
    credential: Credential | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


def _seg(value: str) -> str:
    """One path segment, percent-encoded (model ids may contain ``/`` or spaces)."""
    return quote(value, safe="")


def _json(doc: object) -> bytes:
    return msgspec.json.encode(doc)


class Calls:
    """Builders of every control-API call (no I/O). Sources: the specification's
    "HTTP control surface" and "Local wire contract"."""

    @staticmethod
    def healthz() -> Call[dict[str, Any]]:
        """``GET /healthz``: liveness."""
        return Call("GET", "/healthz", dict)

    @staticmethod
    def status(detail: bool = False) -> Call[dict[str, Any]]:
        """``GET /allocator/status``: controller and server status (``detail`` adds plans)."""
        return Call("GET", "/allocator/status", dict, params={"detail": "1"} if detail else {})

    @staticmethod
    def explain(model_id: str) -> Call[dict[str, Any]]:
        """``GET /allocator/explain/{id}``: why a model is placed where it is (or is not)."""
        return Call("GET", f"/allocator/explain/{_seg(model_id)}", dict)

    @staticmethod
    def get_model(model_id: str) -> Call[dict[str, Any]]:
        """``GET /allocator/models/{id}``: ``{"model_id", "profile"}``."""
        return Call("GET", f"/allocator/models/{_seg(model_id)}", dict)

    @staticmethod
    def put_model(
        model_id: str, profile: Mapping[str, object], *, if_version: str | None = None
    ) -> Call[dict[str, Any]]:
        """``PUT /allocator/models/{id}``: create or replace a profile (operator).

        Args:
            model_id: the model.
            profile: the complete profile.
            if_version: the version the caller read (``"version"`` of a GET): the write is
                refused with 409 if the profile changed meanwhile; ``""`` means the caller
                read no profile (create only); ``None`` writes unconditionally.
        """
        path = f"/allocator/models/{_seg(model_id)}"
        headers: dict[str, str] = {}
        if if_version == "":
            headers["If-None-Match"] = "*"
        elif if_version is not None:
            headers["If-Match"] = f'"{if_version}"'
        return Call("PUT", path, dict, _json(dict(profile)), "operator", headers=headers)

    @staticmethod
    def delete_model(model_id: str) -> Call[dict[str, Any]]:
        """``DELETE /allocator/models/{id}``: retire a profile (operator)."""
        return Call("DELETE", f"/allocator/models/{_seg(model_id)}", dict, None, "operator")

    @staticmethod
    def set_mode(mode: str) -> Call[dict[str, Any]]:
        """``PUT /allocator/mode``: observe, recommend or automatic (operator)."""
        return Call("PUT", "/allocator/mode", dict, _json(ModeBody(mode=mode)), "operator")  # type: ignore[arg-type]  # the server names a bad mode

    @staticmethod
    def tick() -> Call[dict[str, Any]]:
        """``POST /allocator/tick``: one reconciliation pass now (operator)."""
        return Call("POST", "/allocator/tick", dict, None, "operator")

    @staticmethod
    def forward_observations(body: ObservationBatch) -> Call[dict[str, Any]]:
        """``POST /allocator/observations``: a follower's answered requests, as demand for the
        leader's controller (operator; a follower refuses it with 503)."""
        return Call("POST", "/allocator/observations", dict, _json(body), "operator")

    @staticmethod
    def record_evaluation(body: EvaluationBody) -> Call[dict[str, Any]]:
        """``POST /allocator/evaluations``: labelled quality evidence (operator)."""
        return Call("POST", "/allocator/evaluations", dict, _json(body), "operator")

    @staticmethod
    def issue_node_credential(
        host_id: str | None = None, ttl_s: float | None = None
    ) -> Call[NodeCredential]:
        """``POST /allocator/tokens``: an expiring credential scoped to one host (operator)."""
        body = TokenBody(host_id=host_id) if ttl_s is None else TokenBody(host_id, ttl_s)
        return Call("POST", "/allocator/tokens", NodeCredential, _json(body), "operator")

    @staticmethod
    def issue_join_token(
        host_id: str | None = None, ttl_s: float | None = None
    ) -> Call[JoinTokenIssued]:
        """``POST /allocator/join-tokens``: a one-time join token for one host (operator)."""
        body = JoinTokenBody(host_id=host_id) if ttl_s is None else JoinTokenBody(host_id, ttl_s)
        return Call("POST", "/allocator/join-tokens", JoinTokenIssued, _json(body), "operator")

    @staticmethod
    def redeem_join() -> Call[NodeCredential]:
        """``POST /allocator/join``: spend a join token for a node credential (join token)."""
        return Call("POST", "/allocator/join", NodeCredential, None, "join")

    @staticmethod
    def revoke_host(host_id: str) -> Call[dict[str, Any]]:
        """``POST /allocator/hosts/{id}/revoke``: refuse the host's credentials (operator)."""
        return Call("POST", f"/allocator/hosts/{_seg(host_id)}/revoke", dict, None, "operator")

    @staticmethod
    def create_client_key(name: str) -> Call[ClientKeyIssued]:
        """``POST /allocator/client-keys``: a new ``/v1`` client key, shown once (operator)."""
        body = _json(ClientKeyBody(name=name))
        return Call("POST", "/allocator/client-keys", ClientKeyIssued, body, "operator")

    @staticmethod
    def client_keys() -> Call[dict[str, Any]]:
        """``GET /allocator/client-keys``: names, ids and creation times (operator)."""
        return Call("GET", "/allocator/client-keys", dict, None, "operator")

    @staticmethod
    def revoke_client_key(name: str) -> Call[dict[str, Any]]:
        """``DELETE /allocator/client-keys/{name}``: refuse that key from now on (operator)."""
        return Call("DELETE", f"/allocator/client-keys/{_seg(name)}", dict, None, "operator")

    @staticmethod
    def register(record_id: str, doc: NodeRegistration) -> Call[Registered]:
        """``PUT /nodes/{id}``: register a control or engine record (node credential)."""
        return Call("PUT", f"/nodes/{_seg(record_id)}", Registered, _json(doc), "node")

    @staticmethod
    def heartbeat(record_id: str, doc: Heartbeat) -> Call[HeartbeatResponse]:
        """``POST /nodes/{id}/heartbeat``: refresh a lease, receive commands (node)."""
        path = f"/nodes/{_seg(record_id)}/heartbeat"
        return Call("POST", path, HeartbeatResponse, _json(doc), "node")

    @staticmethod
    def remove(record_id: str, instance_id: str | None = None) -> Call[dict[str, Any]]:
        """``DELETE /nodes/{id}``: withdraw a record this host owns (node credential);
        ``instance_id`` names the sending agent run (refused with 409 once superseded)."""
        query = f"?instance={_seg(instance_id)}" if instance_id else ""
        return Call("DELETE", f"/nodes/{_seg(record_id)}{query}", dict, None, "node")

    @staticmethod
    def nodes() -> Call[dict[str, Any]]:
        """``GET /nodes``: public discovery (no keys)."""
        return Call("GET", "/nodes", dict)

    @staticmethod
    def models() -> Call[dict[str, Any]]:
        """``GET /v1/models``: the OpenAI-compatible list of ready models."""
        return Call("GET", "/v1/models", dict)


class _Base:
    """What both clients share: base URL, credentials, request building, answer decoding."""

    def __init__(
        self, url: str, *, operator_token: str | None = None, node_token: str | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.operator_token = operator_token
        self.node_token = node_token
        self.join_token: str | None = None
        self.client_key: str | None = None
        """A ``/v1`` client API key, sent as ``Authorization: Bearer`` on ``/v1`` calls."""

    def _request(self, call: Call[Any]) -> tuple[str, dict[str, str]]:
        headers = {"accept": "application/json", **call.headers}
        if call.body is not None:
            headers["content-type"] = "application/json"
        if call.credential == "operator":
            if not self.operator_token:
                msg = f"{call.method} {call.path} needs the operator token; none was given"
                raise PlainHttpRefused(msg)
            check_credential_transport(self.url, "operator token")
            headers[OPERATOR_HEADER] = self.operator_token
        elif call.credential == "node":
            if not self.node_token:
                msg = f"{call.method} {call.path} needs a node credential; none was given"
                raise PlainHttpRefused(msg)
            check_credential_transport(self.url, "node credential")
            headers[CONTROL_HEADER] = self.node_token
        elif self.client_key and call.path.startswith("/v1/"):
            check_credential_transport(self.url, "client API key")
            headers["authorization"] = f"Bearer {self.client_key}"
        if call.credential == "join":
            if not self.join_token:
                msg = f"{call.method} {call.path} needs a join token; none was given"
                raise PlainHttpRefused(msg)
            check_credential_transport(self.url, "join token")
            headers[JOIN_HEADER] = self.join_token
        return self.url + call.path, headers

    start_hint = "grid up"
    """The command quoted when no server answers (a named grid may know a better one)."""

    def _unreachable(self, base: str, exc: httpx.HTTPError) -> GridError:
        tls = describe_tls_failure(exc, base)
        if tls is not None:
            return TlsRefused(tls)
        hint = self.start_hint
        verb = "start one with" if hint == "grid up" else "bring it back with"
        msg = f"no Grid server answered at {base} ({type(exc).__name__}); {verb} '{hint}'"
        return ServerUnreachable(msg)

    @staticmethod
    def _answer(call: Call[T], resp: httpx.Response) -> T:
        if resp.status_code >= 400:
            raise RequestRefused(
                call.method, call.path, resp.status_code, _error_text(resp), _error_details(resp)
            )
        if call.result is HeartbeatResponse:
            try:
                return decode(resp.content, HeartbeatResponse).document  # type: ignore[return-value]  # result is HeartbeatResponse here
            except WireError as exc:
                raise RequestRefused(call.method, call.path, 502, str(exc)) from None
        try:
            return msgspec.json.decode(resp.content or b"null", type=call.result)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            msg = f"the server's answer does not match the contract ({exc})"
            raise RequestRefused(call.method, call.path, 502, msg) from None


def _error_text(resp: httpx.Response) -> str:
    """The message of Grid's JSON error body, else the start of the raw body."""
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    return resp.text[:MAX_ERROR_TEXT]


def _error_details(resp: httpx.Response) -> dict[str, Any] | None:
    """The ``details`` object of Grid's JSON error body, if it has one."""
    try:
        doc = resp.json()
    except ValueError:
        return None
    err = doc.get("error") if isinstance(doc, dict) else None
    details = err.get("details") if isinstance(err, dict) else None
    return details if isinstance(details, dict) else None


def _http_client(timeout: float, ca_file: Path | str | None) -> httpx.Client:
    # No environment proxies: control traffic goes straight to the Grid (often loopback).
    return httpx.Client(timeout=timeout, trust_env=False, verify=tls_verify(ca_file))


class GridClient(_Base):
    """Blocking client for the control API (CLI, fleet, tests).

    Args:
        url: base URL, e.g. ``http://127.0.0.1:22100``.
        operator_token: the operator capability, for ``/allocator`` mutations.
        node_token: a host-scoped node credential, for ``/nodes`` routes.
        http: an httpx client to send through (tests pass Litestar's in-process client);
            one is created and owned when omitted.
        timeout: seconds per request when this client creates its own httpx client.
        ca_file: the CA certificate an ``https://`` server must chain to (``None``: the
            system trust store); used when this client creates its own httpx client.

    Raises (from every call):
        RequestRefused: the server answered with an error status (message names the cause).
        ServerUnreachable: no answer at ``url``.
        TlsRefused: the server's certificate failed verification (wrong CA, expired, SAN
            mismatch, or the server does not speak TLS); the message names which.
        PlainHttpRefused: a credential would travel over plain HTTP off loopback, or the
            route needs a credential that was not given.
    """

    def __init__(
        self,
        url: str,
        *,
        operator_token: str | None = None,
        node_token: str | None = None,
        http: httpx.Client | None = None,
        timeout: float = CONTROL_TIMEOUT_S,
        ca_file: Path | str | None = None,
    ) -> None:
        super().__init__(url, operator_token=operator_token, node_token=node_token)
        self._owned = http is None
        self.http = http if http is not None else _http_client(timeout, ca_file)

    def send(self, call: Call[T]) -> T:
        """Send one call and return its decoded answer."""
        target, headers = self._request(call)
        try:
            resp = self.http.request(
                call.method, target, content=call.body, headers=headers, params=dict(call.params)
            )
        except httpx.HTTPError as exc:
            raise self._unreachable(self.url, exc) from None
        return self._answer(call, resp)

    def with_node_token(self, token: str) -> GridClient:
        """A client for the same server and httpx client, speaking as one host."""
        return GridClient(self.url, node_token=token, http=self.http)

    def close(self) -> None:
        """Close the httpx client if this object created it."""
        if self._owned:
            self.http.close()

    def __enter__(self) -> GridClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Convenience wrappers for the calls the CLI, fleet and tests use most.
    def status(self, detail: bool = False) -> dict[str, Any]:
        """Controller and server status (see :meth:`Calls.status`)."""
        return self.send(Calls.status(detail))

    def put_model(self, model_id: str, profile: Mapping[str, object]) -> dict[str, Any]:
        """Create or replace a profile (see :meth:`Calls.put_model`)."""
        return self.send(Calls.put_model(model_id, profile))

    def set_mode(self, mode: str) -> dict[str, Any]:
        """Select observe, recommend or automatic (see :meth:`Calls.set_mode`)."""
        return self.send(Calls.set_mode(mode))

    def tick(self) -> dict[str, Any]:
        """One reconciliation pass now (see :meth:`Calls.tick`)."""
        return self.send(Calls.tick())

    def issue_node_credential(
        self, host_id: str | None = None, ttl_s: float | None = None
    ) -> NodeCredential:
        """A host-scoped node credential (see :meth:`Calls.issue_node_credential`)."""
        return self.send(Calls.issue_node_credential(host_id, ttl_s))

    def models(self) -> list[str]:
        """Ids of the models ``/v1/models`` lists as ready."""
        return [str(m["id"]) for m in self.send(Calls.models()).get("data", [])]


class AsyncGridClient(_Base):
    """Asynchronous client for the control API (the node agent's event loop).

    Arguments and errors are those of :class:`GridClient`; ``http`` is an
    ``httpx.AsyncClient`` (tests may pass one on ``httpx.ASGITransport``).
    """

    def __init__(
        self,
        url: str,
        *,
        operator_token: str | None = None,
        node_token: str | None = None,
        http: httpx.AsyncClient | None = None,
        timeout: float = CONTROL_TIMEOUT_S,
        ca_file: Path | str | None = None,
    ) -> None:
        super().__init__(url, operator_token=operator_token, node_token=node_token)
        self._owned = http is None
        self.http = (
            http
            if http is not None
            else httpx.AsyncClient(timeout=timeout, trust_env=False, verify=tls_verify(ca_file))
        )

    async def send(self, call: Call[T]) -> T:
        """Send one call and return its decoded answer."""
        target, headers = self._request(call)
        try:
            resp = await self.http.request(
                call.method, target, content=call.body, headers=headers, params=dict(call.params)
            )
        except httpx.HTTPError as exc:
            raise self._unreachable(self.url, exc) from None
        return self._answer(call, resp)

    async def aclose(self) -> None:
        """Close the httpx client if this object created it."""
        if self._owned:
            await self.http.aclose()
