"""The controller's durable state and its single-writer lease in etcd (the replicated store).

Several Grid servers can share one etcd cluster; exactly one of them holds the leader key,
which is attached to an etcd lease. Its controller is the only one that may write the state
document or command nodes. Everything goes through etcd's v3 JSON gateway over httpx (keys
and values base64, 64-bit integers as strings); consensus is etcd's, not ours.

Keys under the configured prefix (default ``/grid/``):

- ``controller/state``: the controller document (the bytes the file store keeps in
  ``controller.json``).
- ``controller/leader``: the holder's record (controller id, term, URL, host, PID), attached to
  the holder's etcd lease, so it vanishes when the holder stops renewing.
- ``controller/term``: the last term handed out; it only grows (every takeover adds one in the
  same transaction that creates the leader key).

Every state write is one transaction that compares the leader key's value and lease with this
holder's and the state key's ``mod_revision`` with the one this writer last read: a controller
whose lease lapsed (killed, partitioned from etcd) or that was superseded can never write.

Specification, "Local wire contract" (renewable single-writer lease, term incremented on every
takeover, commands stamped with term and controller id) and "HTTP control surface" (durable
state, automatic mode refused without it).
"""

from __future__ import annotations

import base64
import math
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from grid_core.errors import ConflictError, StateError, UnavailableError, ValidationError
from grid_core.store import LeaseHolder, StateConflictError, check_expected

ETCD_TIMEOUT_S = 2.0
"""Longest wait for one etcd request: far below the controller lease (so a hung endpoint
costs a renewal attempt, not the authority) and far above a loopback or LAN round trip."""
FAILOVER_DETECTION_S = 1.0
"""How much shorter than the controller lease the etcd lease is granted. After a leader dies,
etcd notices the expired lease on its next sweep (every 0.5 s) and a follower tries the key
every 0.25 s at most (``grid_server.leadership.FOLLOWER_POLL_S``): one second covers both, so
a takeover lands inside the controller lease the operator configured, not just after it."""
MIN_LEASE_S = 3
"""Shortest etcd lease Grid asks for: etcd itself refuses leases shorter than about 1.5
election timeouts, and a shorter lease than three seconds cannot be renewed reliably over a
loaded network."""
DEFAULT_PREFIX = "/grid/"
"""Key prefix when the URL names none; one etcd cluster can carry several grids by prefix."""


@dataclass(frozen=True)
class EtcdSettings:
    """Where and how to reach etcd (``grid up --state-store etcd://…`` and its options).

    Attributes:
        endpoints: client URLs (``http://host:port`` or ``https://host:port``), tried in order.
        prefix: key prefix for this grid (ends with ``/``).
        ca_file: CA bundle that signed etcd's server certificate (https endpoints).
        cert_file / key_file: this server's client certificate and key (etcd's
            ``--client-cert-auth``).
        username / password: etcd role-based access control credentials, if enabled.
    """

    endpoints: tuple[str, ...]
    prefix: str = DEFAULT_PREFIX
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str, **options: Any) -> EtcdSettings:
        """Read ``etcd://host:port[,host:port…][/prefix]`` (``etcds://`` for TLS).

        Args:
            url: the state-store URL.
            **options: the remaining fields (``ca_file``, ``cert_file``, ``key_file``,
                ``username``, ``password``).

        Raises:
            ValidationError: not an etcd URL, no endpoint, or a malformed host:port; the
                message names the part and the expected form.
        """
        scheme, sep, rest = url.partition("://")
        http = {"etcd": "http", "etcds": "https"}.get(scheme) if sep else None
        if http is None:
            msg = (
                f"--state-store '{url}': expected etcd://host:port[,host:port…][/prefix] "
                "(etcds:// for TLS) or a file path"
            )
            raise ValidationError(msg)
        hosts, _, path = rest.partition("/")
        endpoints = []
        for part in hosts.split(","):
            host, _, port = part.strip().rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                msg = f"--state-store '{url}': '{part}' is not host:port (e.g. 127.0.0.1:2379)"
                raise ValidationError(msg)
            endpoints.append(f"{http}://{host}:{int(port)}")
        if http == "https" and (options.get("cert_file") is None) != (
            options.get("key_file") is None
        ):
            msg = "--etcd-cert and --etcd-key go together: give both or neither"
            raise ValidationError(msg)
        if (options.get("username") is None) != (options.get("password") is None):
            msg = "--etcd-user needs --etcd-password-file (and the other way round)"
            raise ValidationError(msg)
        prefix = "/" + path.strip("/") + "/" if path.strip("/") else DEFAULT_PREFIX
        return cls(endpoints=tuple(endpoints), prefix=prefix, **options)

    def describe(self) -> str:
        """The settings as an operator reads them (no secrets)."""
        return f"etcd {','.join(self.endpoints)} prefix {self.prefix}"


class EtcdUnavailableError(UnavailableError):
    """No etcd endpoint answered (HTTP 503). Not a :class:`StateError`: the document is not
    corrupt, so nothing is quarantined; the caller retries later."""


def _b64(raw: bytes | str) -> str:
    return base64.b64encode(raw.encode() if isinstance(raw, str) else raw).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


class _Leader(msgspec.Struct, kw_only=True):
    """The value of the leader key."""

    holder: str
    term: int
    url: str = ""
    hostname: str = ""
    pid: int = 0


class EtcdStateStore:
    """State document and single-writer lease in etcd (see the module docstring).

    Thread-safe: the server calls it from worker threads (controller passes) and from its
    leadership loop.

    Args:
        settings: endpoints, prefix, TLS and auth.
        advertise_url: this server's URL, written into the leader record so followers can
            point operators and node agents at the leader.
        timeout_s: per-request timeout in seconds.
    """

    durable = True

    def __init__(
        self,
        settings: EtcdSettings,
        *,
        advertise_url: str = "",
        timeout_s: float = ETCD_TIMEOUT_S,
    ) -> None:
        self.settings = settings
        self.advertise_url = advertise_url
        p = settings.prefix
        self.state_key = f"{p}controller/state"
        self.leader_key = f"{p}controller/leader"
        self.term_key = f"{p}controller/term"
        verify: str | bool = settings.ca_file if settings.ca_file else True
        cert = (
            (settings.cert_file, settings.key_file)
            if settings.cert_file and settings.key_file
            else None
        )
        self._http = httpx.Client(timeout=timeout_s, verify=verify, cert=cert)
        self._lock = threading.RLock()
        self._endpoint = 0
        self._token: str | None = None
        self._lease_id: str | None = None
        self._holder: str | None = None
        self._term = 0

    def __repr__(self) -> str:
        return f"EtcdStateStore({self.settings.describe()})"

    @property
    def term(self) -> int:
        """The term of the lease this store holds (0 before the first takeover)."""
        return self._term

    def close(self) -> None:
        """Release the HTTP connections (the lease is left to expire or be released)."""
        self._http.close()

    # --- transport ----------------------------------------------------------------------
    def _authenticate(self, base: str) -> str:
        s = self.settings
        resp = self._http.post(
            f"{base}/v3/auth/authenticate", json={"name": s.username, "password": s.password}
        )
        if resp.status_code != 200:
            msg = f"etcd at {base} refused user '{s.username}': {resp.text[:200]}"
            raise StateError(msg)
        self._token = str(resp.json().get("token", ""))
        return self._token

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST one gateway request, trying each endpoint from the last one that answered.

        Raises:
            EtcdUnavailableError: no endpoint answered.
            StateError: etcd refused the request.
        """
        errors = []
        n = len(self.settings.endpoints)
        for i in range(n):
            idx = (self._endpoint + i) % n
            base = self.settings.endpoints[idx]
            try:
                if self.settings.username and self._token is None:
                    self._authenticate(base)
                headers = {"Authorization": self._token} if self._token else {}
                resp = self._http.post(f"{base}{path}", json=body, headers=headers)
                if resp.status_code == 401 and self.settings.username:
                    # An expired token: authenticate again, once.
                    headers = {"Authorization": self._authenticate(base)}
                    resp = self._http.post(f"{base}{path}", json=body, headers=headers)
            except httpx.HTTPError as exc:
                errors.append(f"{base}: {type(exc).__name__}")
                continue
            self._endpoint = idx
            if resp.status_code != 200:
                msg = f"etcd at {base} refused {path}: {resp.status_code} {resp.text[:200]}"
                raise StateError(msg)
            data: dict[str, Any] = resp.json()
            return data
        msg = f"etcd unreachable ({'; '.join(errors)}); check --state-store and the etcd cluster"
        raise EtcdUnavailableError(msg)

    def _range(self, key: str) -> dict[str, Any] | None:
        kvs = self._call("/v3/kv/range", {"key": _b64(key)}).get("kvs") or []
        return kvs[0] if kvs else None

    def _txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]]) -> bool:
        return bool(
            self._call("/v3/kv/txn", {"compare": compare, "success": success}).get(
                "succeeded", False
            )
        )

    def _held(self) -> list[dict[str, Any]]:
        """Compares that hold only while this store's lease owns the leader key."""
        if self._lease_id is None or self._holder is None:
            msg = "this Grid server does not hold the controller lease; the leader writes state"
            raise StateConflictError(msg)
        key = _b64(self.leader_key)
        return [
            {"key": key, "target": "LEASE", "result": "EQUAL", "lease": self._lease_id},
        ]

    # --- state --------------------------------------------------------------------------
    def load(self) -> bytes | None:
        """The saved state document, or ``None`` when etcd has none yet.

        Raises:
            EtcdUnavailableError: etcd unreachable (nothing is corrupt; retry).
            StateError: etcd refused the read.
        """
        with self._lock:
            kv = self._range(self.state_key)
            return _unb64(kv.get("value", "")) if kv is not None else None

    def save(self, data: bytes, expected: str | None) -> None:
        """Replace the document in one transaction, only while this server leads.

        The transaction compares the leader key's lease with this server's and the state
        key's revision with the one whose bytes match ``expected``.

        Args:
            data: the new document.
            expected: digest of the bytes this writer last loaded or wrote.

        Raises:
            StateConflictError: this server no longer holds the lease, or another controller
                wrote the document since; nothing was written.
            EtcdUnavailableError: etcd unreachable (nothing was written).
            StateError: etcd refused the write.
        """
        with self._lock:
            held = self._held()
            kv = self._range(self.state_key)
            current = _unb64(kv.get("value", "")) if kv is not None else None
            check_expected(current, expected, f"in {self.settings.describe()}")
            revision = kv.get("mod_revision", "0") if kv is not None else "0"
            compare = [
                *held,
                {
                    "key": _b64(self.state_key),
                    "target": "MOD",
                    "result": "EQUAL",
                    "mod_revision": revision,
                },
            ]
            put = {"request_put": {"key": _b64(self.state_key), "value": _b64(data)}}
            if not self._txn(compare, [put]):
                self._lease_id = None
                msg = (
                    "the controller lease in etcd lapsed or the state changed before this write; "
                    "this server is no longer the leader and wrote nothing"
                )
                raise StateConflictError(msg)

    def quarantine(self, reason: str) -> str:
        """Move a corrupt document aside to ``controller/corrupt-<stamp>``; returns the key.

        Raises:
            EtcdUnavailableError / StateError: etcd unreachable, or refused the move.
        """
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        dest = f"{self.settings.prefix}controller/corrupt-{stamp}-{os.urandom(2).hex()}"
        with self._lock:
            kv = self._range(self.state_key)
            if kv is None:
                return dest
            ops = [
                {"request_put": {"key": _b64(dest), "value": kv.get("value", "")}},
                {"request_put": {"key": _b64(dest + ".reason"), "value": _b64(reason)}},
                {"request_delete_range": {"key": _b64(self.state_key)}},
            ]
            same = {
                "key": _b64(self.state_key),
                "target": "MOD",
                "result": "EQUAL",
                "mod_revision": kv.get("mod_revision", "0"),
            }
            if not self._txn([same], ops):
                msg = f"cannot quarantine {self.state_key}: it changed meanwhile; retry"
                raise StateError(msg)
        return dest

    # --- lease --------------------------------------------------------------------------
    def leader(self) -> LeaseHolder | None:
        """Who holds the controller lease now, or ``None`` when nobody does.

        Raises:
            EtcdUnavailableError: etcd unreachable.
        """
        with self._lock:
            kv = self._range(self.leader_key)
            if kv is None:
                return None
            rec = msgspec.json.decode(_unb64(kv.get("value", "")), type=_Leader)
            ttl = self._call("/v3/lease/timetolive", {"ID": kv.get("lease", "0")}).get("TTL")
            return LeaseHolder(
                holder=rec.holder, term=rec.term, url=rec.url, expires_in_s=float(ttl or 0)
            )

    def acquire_lease(self, controller_id: str, now: float, ttl_s: float) -> tuple[int, float]:
        """Take or renew the controller lease (an etcd lease owning the leader key).

        A renewal is an etcd keep-alive; a takeover creates the leader key only if none
        exists and adds one to the term key, both in one transaction.

        Args:
            controller_id: this controller's identity.
            now: wall-clock seconds read *before* this call (the returned expiry is counted
                from it, so it never outlasts etcd's own lease).
            ttl_s: the controller lease in seconds; etcd's lease is granted
                :data:`FAILOVER_DETECTION_S` shorter (whole seconds, at least
                :data:`MIN_LEASE_S`), and the returned expiry follows etcd's.

        Returns:
            ``(term, expires_at)``.

        Raises:
            ConflictError: another controller holds the lease, or this one's lapsed (its
                authority is gone; a later call may take a new term).
            EtcdUnavailableError / StateError: etcd unreachable, or refused.
        """
        ttl = max(MIN_LEASE_S, math.ceil(ttl_s - FAILOVER_DETECTION_S))
        with self._lock:
            if self._lease_id is not None and self._holder == controller_id:
                alive = self._call("/v3/lease/keepalive", {"ID": self._lease_id})
                left = int((alive.get("result") or {}).get("TTL", 0) or 0)
                if left > 0:
                    return self._term, now + ttl
                self._lease_id = None
                msg = f"the controller lease in etcd lapsed (term {self._term}); authority lost"
                raise ConflictError(msg)
            self._lease_id = None
            current = self.leader()
            if current is not None:
                msg = (
                    f"controller '{current.holder}' holds the lease in etcd for "
                    f"{current.expires_in_s:.0f} s more (term {current.term}"
                    + (f", at {current.url}" if current.url else "")
                    + "); this server follows"
                )
                raise ConflictError(msg)
            return self._take(controller_id, now, ttl)

    def _take(self, controller_id: str, now: float, ttl: int) -> tuple[int, float]:
        """Grant a lease and create the leader key with the next term (one transaction)."""
        kv = self._range(self.term_key)
        term = int(_unb64(kv.get("value", "")).decode() or 0) if kv is not None else 0
        term_rev = kv.get("mod_revision", "0") if kv is not None else "0"
        lease_id = str(self._call("/v3/lease/grant", {"TTL": ttl})["ID"])
        record = _Leader(
            holder=controller_id,
            term=term + 1,
            url=self.advertise_url,
            hostname=socket.gethostname(),
            pid=os.getpid(),
        )
        compare = [
            {
                "key": _b64(self.leader_key),
                "target": "CREATE",
                "result": "EQUAL",
                "create_revision": "0",
            },
            {
                "key": _b64(self.term_key),
                "target": "MOD",
                "result": "EQUAL",
                "mod_revision": term_rev,
            },
        ]
        success = [
            {
                "request_put": {
                    "key": _b64(self.leader_key),
                    "value": _b64(msgspec.json.encode(record)),
                    "lease": lease_id,
                }
            },
            {"request_put": {"key": _b64(self.term_key), "value": _b64(str(term + 1))}},
        ]
        if not self._txn(compare, success):
            self._call("/v3/lease/revoke", {"ID": lease_id})
            msg = "another controller took the lease in etcd at the same moment; this one follows"
            raise ConflictError(msg)
        self._lease_id, self._holder, self._term = lease_id, controller_id, term + 1
        return self._term, now + ttl

    def release_lease(self, controller_id: str) -> None:
        """Give the lease up at once (a clean stop), so a follower takes over without waiting.

        Raises:
            EtcdUnavailableError: etcd unreachable (the lease then lapses on its own).
        """
        with self._lock:
            if self._lease_id is None or self._holder != controller_id:
                return
            lease_id, self._lease_id = self._lease_id, None
            self._call("/v3/lease/revoke", {"ID": lease_id})

    def seed_term(self, term: int) -> None:
        """Raise the term counter to at least ``term`` (moving from another store).

        Nodes reject commands below the highest term they saw, so a grid moved from the file
        store must continue above that store's term.

        Raises:
            StateError: etcd unreachable, or the counter changed meanwhile (retry).
        """
        with self._lock:
            kv = self._range(self.term_key)
            have = int(_unb64(kv.get("value", "")).decode() or 0) if kv is not None else 0
            if have >= term:
                return
            rev = kv.get("mod_revision", "0") if kv is not None else "0"
            same = {
                "key": _b64(self.term_key),
                "target": "MOD",
                "result": "EQUAL",
                "mod_revision": rev,
            }
            put = {"request_put": {"key": _b64(self.term_key), "value": _b64(str(term))}}
            if not self._txn([same], [put]):
                msg = f"the term counter {self.term_key} changed meanwhile; retry"
                raise StateError(msg)


def settings_from_options(
    url: str,
    *,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    username: str | None = None,
    password_file: str | None = None,
) -> EtcdSettings:
    """Build :class:`EtcdSettings` from CLI options (the password is read from a file).

    Raises:
        ValidationError: a malformed URL or option pair, or an unreadable password file.
    """
    password = None
    if password_file is not None:
        try:
            password = open(password_file, encoding="utf-8").read().strip()  # noqa: SIM115
        except OSError as exc:
            msg = f"--etcd-password-file {password_file}: {exc.strerror}"
            raise ValidationError(msg) from None
    return EtcdSettings.parse(
        url,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
        username=username,
        password=password,
    )


def endpoint_list(endpoints: Sequence[str]) -> str:
    """``etcd://h:p,h:p`` for a list of plain ``http://h:p`` endpoints (tests, docs)."""
    return "etcd://" + ",".join(e.split("://", 1)[1] for e in endpoints)
