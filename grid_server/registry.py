"""The node registry: authenticated records with 60-second leases, kept in memory.

Source: the specification's "Local wire contract". Record ids are derived from the
authenticated host (and model), so a host credential can only ever write its own records.
Engine API keys live in a separate private map and never leave this module except for the
upstream hop.

The registry is also where a revoked host leaves the grid: :meth:`Registry.withdraw` takes
its records out of :attr:`Registry.records` — the one map the router's route table, the
controller's host view, discovery and metrics are built from — so none of them sees the host
from that moment on, and a write under a credential issued before the revocation is refused
here too (a request verified just before the revocation cannot put the records back).
"""

from __future__ import annotations

import functools
import math
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

import msgspec

from grid_core.client import is_loopback_host
from grid_core.errors import (
    AuthError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    ValidationError,
)
from grid_core.hosts import (
    INSTANCE_LAPSE_S,
    LEASE_TTL_S,
    InstanceClaim,
    RegistryRecord,
    instance_verdict,
)
from grid_core.nodeconfig import MAX_HEARTBEAT_INTERVAL_S
from grid_core.wire import Decoded, Heartbeat, NodeRegistration, control_record_id, engine_record_id

MAX_ENGINE_CA_CONTEXTS = 64
"""Distinct engine CA bundles whose TLS contexts are kept built: one per private CA in use,
so a fleet re-registering every minute never re-parses its CA."""
MAX_RECORDS = 4096
"""Registry ceiling: 64 hosts × 64 engines; refuses unbounded growth from a buggy node."""
MAX_INSTANCE_REFUSALS = 32
"""Most recent refusals of a node agent run under a held host id kept for status: one
screen of them; each agent also keeps its own refusal as its last error."""
INSTANCE_SHOWN_CHARS = 12
"""Leading characters of an agent instance id shown in messages and discovery: enough to
tell runs apart, and the full id (part of the agent's identity proof) is never published."""


def check_engine_url(url: str | None) -> str:
    """Validate an engine route URL; plain HTTP is accepted only on loopback.

    Raises:
        ValidationError: missing, malformed, or non-loopback plain HTTP (the engine key would
            cross the network in clear text).
    """
    if not url:
        msg = "engine registration: 'url' is required (e.g. http://127.0.0.1:8080)"
        raise ValidationError(msg)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        msg = f"engine registration: 'url' {url!r} must be http(s)://host:port with no path"
        raise ValidationError(msg)
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        msg = (
            f"engine registration: 'url' {url!r} is plain HTTP off loopback; "
            "advertise an https:// engine address"
        )
        raise ValidationError(msg)
    return url.rstrip("/")


def refuse_route_to_server(url: str, server_url: str | None) -> None:
    """Refuse an engine route that points at this Grid server itself.

    A request for such a route would be proxied back into the server, hold an upstream
    connection for every hop and stall every other model's traffic. Same port and the same
    host (or both loopback / the wildcard address) is the server.

    Raises:
        ValidationError: the route is the server's own address (message names the field).
    """
    if not server_url:
        return
    route, server = urlsplit(url), urlsplit(server_url)
    try:
        route_port = route.port or (443 if route.scheme == "https" else 80)
        server_port = server.port or (443 if server.scheme == "https" else 80)
    except ValueError:
        return  # a malformed port was refused by check_engine_url already
    if route_port != server_port:
        return
    rh, sh = (route.hostname or "").lower(), (server.hostname or "").lower()
    wildcard = {"0.0.0.0", "::"}
    same = (
        rh == sh
        or rh in wildcard
        or (is_loopback_host(rh) and (is_loopback_host(sh) or sh in wildcard))
    )
    if same:
        msg = (
            f"engine registration: 'url' {url!r} is this Grid server's own address; "
            "register the engine's own host:port (the node's advertised address)"
        )
        raise ValidationError(msg)


def _bare(host: str | None) -> str:
    """A host name or IP literal compared the way URLs spell it (case-free, no brackets)."""
    return (host or "").strip("[]").lower().rstrip(".")


def check_engine_host(url: str, host_id: str, control: RegistryRecord | None) -> None:
    """Refuse an engine route that is not on its node's own advertised address.

    A node credential may only route traffic to its own machine: with an advertised address
    (``--advertise-host``) every engine URL of the host must name exactly that address; a node
    that advertises none runs its engines beside the server, so only loopback is its own.
    Otherwise one credential could point the shared router at another host's engines or at
    any service on the intranet (issue 20; specification, "Local wire contract" and the
    node's advertised engine address).

    Args:
        url: the engine route (already checked by :func:`check_engine_url`).
        host_id: the authenticated host registering it.
        control: the host's control record (``None`` when it has none yet).

    Raises:
        NotFoundError: a non-loopback route from a host with no control record (register the
            control record, with its advertised address, first; the node retries).
        ValidationError: the route names another address than the advertised one.
    """
    route = _bare(urlsplit(url).hostname)
    advertised = control.advertise_host if control is not None else None
    if advertised is not None and not is_loopback_host(_bare(advertised)):
        if route == _bare(advertised):
            return
        msg = (
            f"engine registration: 'url' {url!r} is not on host '{host_id}''s advertised "
            f"address {advertised!r}; an engine route must point at its own node"
        )
        raise ValidationError(msg)
    if is_loopback_host(route):
        return
    if control is None:
        msg = (
            f"engine registration: host '{host_id}' has no control record; register it with "
            f"its advertised address before routing 'url' {url!r}"
        )
        raise NotFoundError(msg)
    msg = (
        f"engine registration: 'url' {url!r} is off loopback but host '{host_id}' advertises "
        "no address; start its node with --advertise-host naming this machine"
    )
    raise ValidationError(msg)


@functools.lru_cache(maxsize=MAX_ENGINE_CA_CONTEXTS)
def engine_ssl_context(ca_pem: str) -> ssl.SSLContext:
    """A client TLS context trusting only ``ca_pem``, with hostname checking.

    Source: the specification's wire text on engine registration (an HTTPS engine may carry
    its CA; Grid builds a private hostname-verifying context from it).

    Raises:
        ValidationError: the bundle holds no usable PEM certificate.
    """
    try:
        context = ssl.create_default_context(cadata=ca_pem)
    except (ssl.SSLError, ValueError) as exc:
        msg = f"engine registration: 'engine_ca_pem' is not a PEM CA bundle ({exc})"
        raise ValidationError(msg) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def safety_facts(rec: RegistryRecord | None) -> object:
    """What of a record matters to destructive safety (compare two to see a change).

    Membership (the record exists), role, routed models, the host lifecycle and whether the
    report was rejected, and per residency its state, ownership, revision and whether work
    is in flight (unknown / none / some). Lease refreshes, load, relative ages and exact
    request counts are left out: they keep planning dirty without advancing the safety
    revision, so a steady heartbeat cannot starve destructive delivery (specification,
    "Local wire contract").
    """
    if rec is None:
        return None
    env = rec.allocator
    rows: tuple[object, ...] = ()
    state = None
    if env is not None:
        state = env.state
        rows = tuple(
            sorted(
                (
                    r.model_id,
                    r.state,
                    r.effective_ownership,
                    r.artifact_sha256,
                    None if r.active_requests is None else r.active_requests > 0,
                )
                for r in env.residencies
            )
        )
    return (rec.role, rec.models, rec.url, state, bool(rec.rejected_rows), rows)


def expected_record_id(host_id: str, reg: NodeRegistration) -> str:
    """The only record id a host may use for this registration."""
    if reg.role == "allocator":
        return control_record_id(host_id)
    if not reg.models:
        msg = "engine registration: 'models' must name the model this engine serves"
        raise ValidationError(msg)
    return engine_record_id(host_id, reg.models[0])


class Registry:
    """Live records by id, plus private engine keys (in memory only).

    Args:
        revoked: host id → revocation time (Unix s), as ``$GRID_HOME/revoked-hosts.json``
            holds them when the server starts: writes for those hosts need a credential
            issued after that time.

    Attributes:
        revision: increases on every change of routable membership (caches key on it).
    """

    def __init__(self, revoked: Mapping[str, float] | None = None) -> None:
        self.records: dict[str, RegistryRecord] = {}
        self.revoked: dict[str, float] = dict(revoked or {})
        """Host id → revocation time: a write for the host needs a later credential."""
        self._held: dict[str, dict[str, RegistryRecord]] = {}
        """Host id → records withdrawn at its revocation, restored (while their lease lasts)
        when the host is re-admitted; never routed or counted while held."""
        self._keys: dict[str, str] = {}
        self._ssl: dict[str, ssl.SSLContext] = {}
        self.revision = 0
        self.dropped_routes = 0
        """Engine records withdrawn because their host's advertised address disowned them
        (a safety-relevant membership change; the API compares it across a registration)."""
        self.instances: dict[str, InstanceClaim] = {}
        """Host id → the node-agent run that speaks for it (see ``instance_verdict``)."""
        self.instance_refusals: list[dict[str, object]] = []
        """The latest refusals of another run under a held host id (newest last, at most
        :data:`MAX_INSTANCE_REFUSALS`), as plain data for status."""

    # --- writes --------------------------------------------------------------------------
    def register(
        self,
        host_id: str,
        node_id: str,
        decoded: Decoded[NodeRegistration],
        now: float,
        *,
        issued_at: float | None = None,
    ) -> RegistryRecord:
        """Create or replace the record ``node_id`` for the authenticated ``host_id``.

        ``issued_at`` is when the writer's credential was issued (see :meth:`_admit`).

        Raises:
            AuthError: the host is revoked and the credential is not newer (:meth:`_admit`).
            ForbiddenError: the body names another host, or the id is not the derived one.
            ValidationError: the engine URL is unacceptable.
            ConflictError-like ValidationError: the registry is full.
        """
        reg = decoded.document
        if reg.host_id != host_id:
            msg = (
                f"registration host_id '{reg.host_id}' does not match the credential's "
                f"host '{host_id}'"
            )
            raise ForbiddenError(msg)
        self._admit(host_id, issued_at, now)
        expected = expected_record_id(host_id, reg)
        if node_id != expected:
            msg = f"record id '{node_id}' is not derived from this host; use '{expected}'"
            raise ForbiddenError(msg)
        url = check_engine_url(reg.url) if reg.role == "engine" else None
        if url is not None:
            check_engine_host(url, host_id, self.control_of(host_id))
        if reg.role == "allocator":
            self._check_advertised(host_id, reg.advertise_host, now)
        context = None
        if reg.engine_ca_pem is not None:
            if url is None or not url.startswith("https://"):
                msg = "engine registration: 'engine_ca_pem' is only for an https:// engine 'url'"
                raise ValidationError(msg)
            context = engine_ssl_context(reg.engine_ca_pem)
        if node_id not in self.records and len(self.records) >= MAX_RECORDS:
            msg = f"registry is full ({MAX_RECORDS} records); remove stale nodes"
            raise ValidationError(msg)
        self.claim(
            host_id, reg.instance_id, now, registration=True, replaces=reg.replaces_instance_id
        )
        rec = RegistryRecord(
            record_id=node_id,
            role=reg.role,
            host_id=host_id,
            models=tuple(dict.fromkeys(reg.models)),
            url=url,
            resources=reg.resources,
            allocator=reg.allocator,
            received_at=now,
            lease_expires_at=now + LEASE_TTL_S,
            rejected_rows=decoded.rejected_rows,
            advertise_host=reg.advertise_host if reg.role == "allocator" else None,
        )
        self.records[node_id] = rec
        if reg.role == "allocator":
            self._drop_foreign_routes(host_id, rec)
        if reg.role == "engine" and reg.engine_api_key:
            self._keys[node_id] = reg.engine_api_key
        else:
            self._keys.pop(node_id, None)
        if context is not None:
            self._ssl[node_id] = context
        else:
            self._ssl.pop(node_id, None)
        self.revision += 1
        return rec

    def _check_advertised(self, host_id: str, advertised: str | None, now: float) -> None:
        """Refuse an advertised address another live host already advertises (loopback is
        shared by the nodes of one machine and never claimed)."""
        if advertised is None or is_loopback_host(_bare(advertised)):
            return
        for rec in self.records.values():
            if (
                rec.role == "allocator"
                and rec.host_id != host_id
                and rec.live(now)
                and _bare(rec.advertise_host) == _bare(advertised)
            ):
                msg = (
                    f"registration: 'advertise_host' {advertised!r} is already advertised by "
                    f"host '{rec.host_id}'; each node advertises its own machine's address"
                )
                raise ForbiddenError(msg)

    def _drop_foreign_routes(self, host_id: str, control: RegistryRecord) -> None:
        """Withdraw engine records of ``host_id`` that its new advertised address disowns."""
        for rid, rec in list(self.records.items()):
            if rec.role != "engine" or rec.host_id != host_id or rec.url is None:
                continue
            try:
                check_engine_host(rec.url, host_id, control)
            except (ValidationError, NotFoundError):
                self._remove_record(rid)
                self.dropped_routes += 1

    def _remove_record(self, rid: str) -> None:
        self.records.pop(rid, None)
        self._keys.pop(rid, None)
        self._ssl.pop(rid, None)
        self.revision += 1

    def heartbeat(
        self,
        host_id: str,
        node_id: str,
        decoded: Decoded[Heartbeat],
        now: float,
        *,
        issued_at: float | None = None,
    ) -> RegistryRecord:
        """Refresh a record's lease and fold in the heartbeat's load/resources/envelope.

        ``issued_at`` is when the writer's credential was issued (see :meth:`_admit`).

        Raises:
            AuthError: the host is revoked and the credential is not newer (:meth:`_admit`).
            ForbiddenError: the record or body belongs to another host.
            NotFoundError: the record is not registered (register first).
        """
        hb = decoded.document
        if hb.node_id != node_id:
            msg = f"heartbeat node_id '{hb.node_id}' does not match the path '{node_id}'"
            raise ValidationError(msg)
        if hb.host_id is not None and hb.host_id != host_id:
            msg = f"heartbeat host_id '{hb.host_id}' does not match the credential's '{host_id}'"
            raise ForbiddenError(msg)
        self._admit(host_id, issued_at, now)
        rec = self._owned(host_id, node_id)
        self.claim(host_id, hb.instance_id, now, registration=False)
        changes: dict[str, object] = {"received_at": now, "lease_expires_at": now + LEASE_TTL_S}
        if hb.load is not None:
            changes["load"] = hb.load
        if hb.resources is not None:
            changes["resources"] = hb.resources
        if hb.allocator is not None:
            changes["allocator"] = hb.allocator
            changes["rejected_rows"] = decoded.rejected_rows
        rec = msgspec.structs.replace(rec, **changes)
        self.records[node_id] = rec
        self.revision += 1
        return rec

    def mark_invalid(self, host_id: str, node_id: str, problem: str) -> bool:
        """Fail a known record closed after its host sent an invalid document.

        The lease is not refreshed; the record stays visible but its snapshot is unhealthy
        and it stops routing until a valid report arrives. Returns whether a record changed.
        """
        rec = self.records.get(node_id)
        if rec is None or rec.host_id != host_id:
            return False
        self.records[node_id] = msgspec.structs.replace(
            rec, rejected_rows=(f"invalid report: {problem[:500]}",)
        )
        self.revision += 1
        return True

    def remove(
        self,
        host_id: str,
        node_id: str,
        instance_id: str | None,
        now: float,
        *,
        issued_at: float | None = None,
    ) -> None:
        """Delete a record the host owns; removing the control record releases the host id
        at once, so a cleanly stopped agent's replacement registers without waiting.

        Raises:
            AuthError / ForbiddenError / NotFoundError: as for :meth:`heartbeat`.
            ConflictError: ``instance_id`` names a run that no longer holds the host id.
        """
        self._admit(host_id, issued_at, now)
        rec = self._owned(host_id, node_id)
        self.claim(host_id, instance_id, now, registration=False)
        self._remove_record(node_id)
        if rec.role == "allocator":
            self.instances.pop(host_id, None)

    # --- revocation ----------------------------------------------------------------------
    def withdraw(self, host_id: str, revoked_at: float) -> tuple[RegistryRecord, ...]:
        """Take a revoked host out of the grid now; returns the records withdrawn.

        Its records leave :attr:`records` (so the next route-table rebuild, host snapshot,
        discovery listing and metric scrape do not see the host: its engines get no new
        request and its replicas stop counting, as for a host whose lease lapsed), its
        agent run's hold on the host id is released, and writes need a credential issued
        after ``revoked_at`` from now on. Engine keys stay until the held records lapse, so
        requests already relayed to the host may finish.

        Source: an operator revokes a host whose credential leaked or whose machine is
        compromised (docs/security.md, "Revoking a host"); traffic must stop at once, not
        when the lease lapses.
        """
        self.revoked[host_id] = max(revoked_at, self.revoked.get(host_id, revoked_at))
        taken = {rid: r for rid, r in self.records.items() if r.host_id == host_id}
        for rid in taken:
            del self.records[rid]
        if taken:
            self._held.setdefault(host_id, {}).update(taken)
            self.revision += 1
        self.instances.pop(host_id, None)
        return tuple(sorted(taken.values(), key=lambda r: r.record_id))

    def _admit(self, host_id: str, issued_at: float | None, now: float) -> None:
        """Refuse a write of a revoked host under a credential its revocation covers; a newer
        credential re-admits the host, restoring its held records whose lease still runs.

        ``issued_at`` ``None`` (unknown) counts as covered for a revoked host.

        Raises:
            AuthError: the host is revoked at or after ``issued_at`` (the same refusal the
                credential check gives; this one closes the window between that check and
                the write, during which the body is read).
        """
        revoked_at = self.revoked.get(host_id)
        if revoked_at is None:
            return
        if issued_at is None or issued_at <= revoked_at:
            msg = (
                f"node credential for host '{host_id}' was revoked; provision the host "
                "again with 'grid allocator join write' or 'grid allocator token write'"
            )
            raise AuthError(msg)
        held = self._held.pop(host_id, None)
        if held:
            for rid, rec in held.items():
                if rec.live(now) and rid not in self.records:
                    self.records[rid] = rec
            self.revision += 1

    def revocations(self) -> list[dict[str, object]]:
        """Revoked hosts for status, oldest id first: ``state`` ``withdrawn`` (nothing of the
        host routes or counts) or ``readmitted`` (records written under a credential issued
        after the revocation), with the reason in words."""
        present = {r.host_id for r in self.records.values()}
        out: list[dict[str, object]] = []
        for host_id, at in sorted(self.revoked.items()):
            back = host_id in present
            out.append(
                {
                    "host_id": host_id,
                    "revoked_at": at,
                    "state": "readmitted" if back else "withdrawn",
                    "reason": (
                        "re-admitted: records written under a credential issued after the "
                        "revocation"
                        if back
                        else "revoked by the operator: its engines receive no requests and "
                        "its replicas do not count; credentials issued before the revocation "
                        "are refused"
                    ),
                }
            )
        return out

    def claim(
        self,
        host_id: str,
        instance_id: str | None,
        now: float,
        *,
        registration: bool,
        replaces: str | None = None,
    ) -> None:
        """Apply the one-run-per-host-id rule to a report from ``instance_id`` (``replaces``:
        a registration's predecessor on the same state directory).

        Accepted reports refresh the holder's ``last_seen``; a take-over makes the sender the
        holder. Source: :func:`grid_core.hosts.instance_verdict`.

        Raises:
            ConflictError: another run holds the host id and still reports (a registration),
                or the sender was superseded by a newer run (a heartbeat or removal). The
                message names the host id and what the operator can do.
        """
        current = self.instances.get(host_id)
        verdict = instance_verdict(
            current, instance_id, now, registration=registration, replaces=replaces
        )
        if verdict == "accept" and instance_id is not None:
            self.instances[host_id] = InstanceClaim(instance_id=instance_id, last_seen=now)
        elif verdict == "take_over":
            assert instance_id is not None
            self.instances[host_id] = InstanceClaim(instance_id=instance_id, last_seen=now)
        elif verdict in ("held", "superseded"):
            assert current is not None and instance_id is not None
            msg = instance_refusal(host_id, current, instance_id, now, verdict)
            self.instance_refusals.append(
                {
                    "host_id": host_id,
                    "instance": instance_id[:INSTANCE_SHOWN_CHARS],
                    "holder": current.instance_id[:INSTANCE_SHOWN_CHARS],
                    "verdict": verdict,
                    "at": now,
                    "message": msg,
                }
            )
            del self.instance_refusals[:-MAX_INSTANCE_REFUSALS]
            raise ConflictError(msg)

    def expire(self, now: float) -> int:
        """Drop records whose lease has run out; returns how many were dropped."""
        for host_id, held in list(self.instances.items()):
            if now - held.last_seen >= INSTANCE_LAPSE_S:
                del self.instances[host_id]  # lapsed: the next registration would take over
        dead = [rid for rid, r in self.records.items() if not r.live(now)]
        for rid in dead:
            del self.records[rid]
            self._keys.pop(rid, None)
            self._ssl.pop(rid, None)
        for host_id, kept in list(self._held.items()):
            for rid, r in list(kept.items()):
                if not r.live(now):
                    del kept[rid]
                    if rid not in self.records:
                        self._keys.pop(rid, None)
                        self._ssl.pop(rid, None)
            if not kept:
                del self._held[host_id]
        if dead:
            self.revision += 1
        return len(dead)

    def _owned(self, host_id: str, node_id: str) -> RegistryRecord:
        rec = self.records.get(node_id)
        if rec is None:
            msg = f"node '{node_id}' is not registered; PUT /nodes/{node_id} first"
            raise NotFoundError(msg)
        if rec.host_id != host_id:
            msg = f"node '{node_id}' belongs to another host; use that host's credential"
            raise ForbiddenError(msg)
        return rec

    # --- reads --------------------------------------------------------------------------
    def engine_key(self, record_id: str) -> str | None:
        """The private upstream key of an engine record (for the proxy hop only)."""
        return self._keys.get(record_id)

    def engine_ssl(self, record_id: str) -> ssl.SSLContext | bool:
        """How the proxy verifies an ``https://`` engine: the context built from the CA it
        registered, else ``True`` (the system trust store, hostname checked). Plain-HTTP
        (loopback) engines ignore it."""
        return self._ssl.get(record_id, True)

    def engine_key_known(self, record_id: str) -> bool:
        """Whether the engine registered a private key (public output says only this)."""
        return record_id in self._keys

    def live(self, now: float) -> list[RegistryRecord]:
        """Records whose lease has not expired."""
        return [r for r in self.records.values() if r.live(now)]

    def control_of(self, host_id: str) -> RegistryRecord | None:
        """The host's control record, if registered."""
        from grid_core.wire import control_record_id

        return self.records.get(control_record_id(host_id))

    def public(self, now: float) -> list[dict[str, object]]:
        """Discovery output: no keys, no private measurements."""
        out: list[dict[str, object]] = []
        for r in sorted(self.records.values(), key=lambda r: r.record_id):
            env = r.allocator
            out.append(
                {
                    "node_id": r.record_id,
                    "role": r.role,
                    "host_id": r.host_id,
                    "models": list(r.models),
                    "url": r.url,
                    "advertise_host": r.advertise_host,
                    "state": env.state if env else None,
                    "lease_remaining_s": round(max(0.0, r.lease_expires_at - now), 3),
                    "live": r.live(now),
                    "engine_key_registered": self.engine_key_known(r.record_id),
                    "rejected_rows": len(r.rejected_rows),
                    "instance": self._shown_instance(r),
                }
            )
        return out

    def _shown_instance(self, rec: RegistryRecord) -> str | None:
        """The leading characters of the run holding a control record's host id."""
        held = self.instances.get(rec.host_id) if rec.role == "allocator" else None
        return held.instance_id[:INSTANCE_SHOWN_CHARS] if held is not None else None


def instance_refusal(
    host_id: str, holder: InstanceClaim, sender: str, now: float, verdict: str
) -> str:
    """The operator-facing reason a report from run ``sender`` was refused (see
    :meth:`Registry.claim`)."""
    mine, theirs = sender[:INSTANCE_SHOWN_CHARS], holder.instance_id[:INSTANCE_SHOWN_CHARS]
    if verdict == "superseded":
        return (
            f"host id '{host_id}': this node agent (instance {mine}) was superseded by another "
            f"agent (instance {theirs}) that registered after this one was silent for "
            f"{INSTANCE_LAPSE_S:.0f} s; this agent must stop"
        )
    # The server sees reports, not processes: it can say when the holder was last heard and
    # when the hold lapses, never that the holder is still alive.
    age = max(0.0, now - holder.last_seen)
    wait = math.ceil(max(0.0, INSTANCE_LAPSE_S - age))
    silence = (
        f", longer than the slowest heartbeat interval ({MAX_HEARTBEAT_INTERVAL_S:.0f} s), so "
        "it has probably stopped"
        if age > MAX_HEARTBEAT_INTERVAL_S
        else ""
    )
    return (
        f"host id '{host_id}' is in use by another node agent (instance {theirs}), last heard "
        f"{age:.0f} s ago{silence}; the host id frees up in {wait} s unless it reports again "
        f"({INSTANCE_LAPSE_S:.0f} s after its last report). If that agent still runs, stop it "
        f"(grid allocator node stop); otherwise wait {wait} s and start this one again. To run "
        "a second agent on this machine give it its own credential (--host-id) and --state-dir"
    )
