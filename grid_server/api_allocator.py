"""``/allocator`` routes: status, profiles, mode, tick, evaluations and node credentials.

Source: the specification's "HTTP control surface". Every mutation needs the operator
capability (``X-Grid-Allocator-Token`` or ``Authorization: Bearer``); status is read-only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post, put
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody

from grid_core import routing
from grid_core.bodies import (
    HOST_ID_PATTERN,
    JOIN_HEADER,
    NODE_CREDENTIAL_TTL_S,
    ClientKeyBody,
    EvaluationBody,
    JoinTokenBody,
    ModeBody,
    ObservationBatch,
    TokenBody,
)
from grid_core.errors import NotFoundError, ValidationError
from grid_core.planner import NATIVE as PLANNER_BUILD
from grid_core.profile import profile_from_json, profile_version
from grid_core.profile_fit import fit_warnings, known_runtimes, runtime_warnings
from grid_core.tls import ca_fingerprint
from grid_server.auth import new_host_id
from grid_server.client_keys import ClientKeys
from grid_server.context import ServerContext
from grid_server.guards import check_transport, operator_guard
from grid_server.http import MAX_CONTROL_BODY_BYTES, MAX_OBSERVATION_BODY_BYTES, json_response
from grid_server.runner import NotLeaderError


def allocator_routes(ctx: ServerContext) -> list[HTTPRouteHandler]:
    """The ``/allocator`` handlers bound to ``ctx`` (and the CA certificate route).

    Mutations carry the operator guard; bodies are typed Structs decoded and validated by
    Litestar (a refusal names the field path); every body is capped at
    :data:`MAX_CONTROL_BODY_BYTES`. Four groups: status and profiles, controls (mode, tick,
    observations, evaluations), node credentials, client keys.
    """
    return [
        *_profile_routes(ctx),
        *_control_routes(ctx),
        *_credential_routes(ctx),
        *_client_key_routes(ctx),
    ]


def _profile_routes(ctx: ServerContext) -> list[HTTPRouteHandler]:
    """Status and model profiles: read, conditional write, removal."""
    operator = [operator_guard(ctx.credentials)]
    limit = MAX_CONTROL_BODY_BYTES

    @get("/allocator/status")
    async def status(request: Request) -> Response:
        """Controller status plus the server's own view (no secrets)."""
        q = request.query_params
        detail = any(k in q for k in ("detail", "json")) and q.get("detail", "1") not in ("0",)
        return json_response(await status_document(ctx, detail))

    @put(
        "/allocator/models/{model_id:str}",
        status_code=200,
        guards=operator,
        request_max_body_size=limit,
    )
    async def put_model(
        request: Request, model_id: FromPath[str], data: JSONBody[dict[str, Any]]
    ) -> Response:
        """Create or replace a model profile (validated whole, or rejected whole).

        ``If-Match: "<version>"`` (the ETag a GET returned) makes the write conditional on
        the stored profile being that version; ``If-None-Match: *`` makes it create-only.
        A stale precondition is refused with 409 showing both versions, and nothing changes.
        """
        if data.setdefault("model_id", model_id) != model_id:
            msg = f"model profile: model_id '{data['model_id']}' does not match the path"
            raise ValidationError(msg)
        # The profile's own validator refuses unknown fields by name with the known ones
        # listed; persisted state stays additive, so the Struct itself cannot forbid them.
        profile = profile_from_json(data)
        hosts = ctx.runner.hosts(time.time())
        installed = ctx.plugins.runtime_adapters() if ctx.plugins is not None else {}
        known = known_runtimes(installed, hosts)
        expected = version_precondition(request.headers)
        await ctx.runner.put_profile(profile, expected)
        stored = ctx.runner.profiles.get(model_id, profile)
        version = profile_version(stored)
        # Accepted, but what keeps it from being placed in full is said now (and in status).
        return json_response(
            {
                "model_id": model_id,
                "profile": stored,
                "version": version,
                "warnings": runtime_warnings(stored, known)
                + fit_warnings(stored, hosts, known, ctx.runner.registration_left_s()),
            },
            headers={"ETag": f'"{version}"'},
        )

    @get("/allocator/models/{model_id:str}")
    async def get_model(model_id: FromPath[str]) -> Response:
        """One model's current profile (public, like status), or 404 when it has none."""
        profile = ctx.runner.profiles.get(model_id)
        if profile is None:
            msg = f"model '{model_id}' has no profile; see 'grid allocator status'"
            raise NotFoundError(msg)
        version = profile_version(profile)
        return json_response(
            {"model_id": model_id, "profile": profile, "version": version},
            headers={"ETag": f'"{version}"'},
        )

    @delete(
        "/allocator/models/{model_id:str}",
        status_code=200,
        guards=operator,
        request_max_body_size=limit,
    )
    async def delete_model(model_id: FromPath[str]) -> Response:
        """Retire a profile; the controller converges it to zero replicas safely."""
        if model_id not in ctx.runner.profile_ids:
            msg = f"model '{model_id}' has no profile; see 'grid allocator status'"
            raise NotFoundError(msg)
        await ctx.runner.remove_profile(model_id)
        return json_response({"model_id": model_id, "removed": True})

    return [status, get_model, put_model, delete_model]


def _control_routes(ctx: ServerContext) -> list[HTTPRouteHandler]:
    """Mode, an immediate tick, forwarded observations and labelled evaluations."""
    operator = [operator_guard(ctx.credentials)]
    limit = MAX_CONTROL_BODY_BYTES

    @put("/allocator/mode", status_code=200, guards=operator, request_max_body_size=limit)
    async def put_mode(data: JSONBody[ModeBody]) -> Response:
        """Select observe, recommend or automatic."""
        await ctx.runner.set_mode(data.mode)
        return json_response({"mode": ctx.runner.mode()})

    @post("/allocator/tick", status_code=200, guards=operator, request_max_body_size=limit)
    async def tick() -> Response:
        """Run one reconciliation pass now and return its result."""
        result = await ctx.runner.tick()
        return json_response({"tick": msgspec.to_builtins(result)})

    @post(
        "/allocator/observations",
        status_code=200,
        guards=operator,
        request_max_body_size=MAX_OBSERVATION_BODY_BYTES,
    )
    async def observations(data: JSONBody[ObservationBatch]) -> Response:
        """Requests a follower server answered, counted as demand here (leader only: a
        follower refuses with 503 naming the leader, and the sender keeps them)."""
        runner = ctx.runner
        if runner.follower is not None:
            raise NotLeaderError(runner.follower)
        for features in data.features:
            runner.observe_here(features)
        return json_response({"accepted": len(data.features), "from_server": data.from_server})

    @post("/allocator/evaluations", status_code=200, guards=operator, request_max_body_size=limit)
    async def evaluations(data: JSONBody[EvaluationBody]) -> Response:
        """Record labelled quality evidence for (model, workload, artifact revision)."""
        sha = data.artifact_sha256.lower() if data.artifact_sha256 else None
        now = ctx.runner.clock()
        # The controller owns the profile lookup (404) and the revision check (409).
        evidence = await ctx.runner.call(
            lambda: ctx.runner.ctl.record_evaluation(
                data.model_id, data.workload, sha, data.score, now, latency_ms=data.latency_ms
            )
        )
        ctx.runner.poke()
        return json_response(
            {
                "model_id": data.model_id,
                "workload": data.workload,
                "score": data.score,
                "artifact_sha256": evidence.artifact_sha256,
                "recorded": True,
                "evidence": msgspec.to_builtins(evidence),
            }
        )

    return [put_mode, tick, evaluations, observations]


def _credential_routes(ctx: ServerContext) -> list[HTTPRouteHandler]:
    """Node credentials: tokens, join tokens, joining, revocation, and the CA certificate."""
    operator = [operator_guard(ctx.credentials)]
    limit = MAX_CONTROL_BODY_BYTES

    @post("/allocator/tokens", status_code=200, guards=operator, request_max_body_size=limit)
    async def tokens(data: JSONBody[TokenBody]) -> Response:
        """Issue an expiring node credential scoped to one host id (operator only)."""
        host_id = data.host_id or new_host_id()
        now = time.time()
        token = ctx.credentials.issue_node(host_id, now, data.ttl_s)
        return json_response({"host_id": host_id, "token": token, "expires_at": now + data.ttl_s})

    @post("/allocator/join-tokens", status_code=200, guards=operator, request_max_body_size=limit)
    async def join_tokens(data: JSONBody[JoinTokenBody]) -> Response:
        """Issue a one-time join token for one host, with the CA fingerprint (operator only)."""
        host_id = data.host_id or new_host_id()
        now = time.time()
        token = ctx.credentials.issue_join(host_id, now, data.ttl_s)
        sha = ca_fingerprint(ctx.ca_pem) if ctx.ca_pem is not None else None
        return json_response(
            {
                "host_id": host_id,
                "join_token": token,
                "expires_at": now + data.ttl_s,
                "ca_sha256": sha,
            }
        )

    @post("/allocator/join", status_code=200, request_max_body_size=limit)
    async def join(request: Request) -> Response:
        """Spend a join token (``X-Grid-Join-Token``) for a host-scoped node credential."""
        check_transport(request)
        now = time.time()
        claims = ctx.credentials.redeem_join(request.headers.get(JOIN_HEADER), now)
        ttl = NODE_CREDENTIAL_TTL_S
        token = ctx.credentials.issue_node(claims.host_id, now, ttl)
        return json_response({"host_id": claims.host_id, "token": token, "expires_at": now + ttl})

    @post(
        "/allocator/hosts/{host_id:str}/revoke",
        status_code=200,
        guards=operator,
        request_max_body_size=limit,
    )
    async def revoke(host_id: FromPath[str]) -> Response:
        """Refuse every credential of one host issued so far and withdraw the host now."""
        if not re.match(HOST_ID_PATTERN, host_id):
            msg = f"host id {host_id!r}: letters, digits, . _ - (at most 128), as in status"
            raise ValidationError(msg)
        return json_response(revoke_host(ctx, host_id, time.time()))

    @get("/tls/ca.pem")
    async def ca_pem() -> Response:
        """The CA certificate of this server (public), for join-token pinning."""
        if ctx.ca_pem is None:
            raise NotFoundError("this server was started without --tls-ca")
        return Response(content=ctx.ca_pem, media_type="application/x-pem-file")

    return [tokens, join_tokens, join, revoke, ca_pem]


def revoke_host(ctx: ServerContext, host_id: str, now: float) -> dict[str, Any]:
    """Revoke ``host_id`` durably, withdraw it from routing and planning, say what it cost.

    Runs on the event loop without awaiting, so no request is routed between the revocation
    and the withdrawal. Requests already relayed to the host's engines may finish.

    Returns:
        ``host_id``, ``revoked_at`` (Unix s), ``engines`` withdrawn (``engine_id``,
        ``models``), ``models`` they served, ``no_ready_replica`` (those models no other
        engine can serve now: requests for them get 503 until a replica is ready elsewhere,
        or 404 for a model without a profile), ``inflight_requests`` still running on the
        host's engines, whether its ``control_record`` (capacity and replicas the
        controller counted) went, and ``already_revoked_at``: the host's previous revocation
        time (Unix s), ``None`` when it was not revoked before. Nothing withdrawn and no
        previous revocation means the server knows no host of that id: a mistyped id, which
        the CLI warns about.

    Raises:
        StateError: the revocation could not be written (nothing changed).
    """
    before = ctx.credentials.revoked.get(host_id)
    rev = ctx.credentials.revoke(host_id, now)
    withdrawn = ctx.registry.withdraw(host_id, rev.revoked_at)
    engines = [r for r in withdrawn if r.role == "engine"]
    models = {m for r in engines for m in r.models}
    router = ctx.router
    mono = time.monotonic()
    remaining = {m: router.candidates(router.routes(m), now, mono, breakers=False) for m in models}
    ctx.runner.input_changed(now, safety_changed=True)  # membership changed: plan again
    return {
        "host_id": rev.host_id,
        "revoked_at": rev.revoked_at,
        "engines": [{"engine_id": r.record_id, "models": list(r.models)} for r in engines],
        "models": sorted(models),
        "no_ready_replica": list(routing.left_without_replica(models, remaining)),
        "inflight_requests": sum(router.inflight.get(r.record_id, 0) for r in engines),
        "control_record": any(r.role == "allocator" for r in withdrawn),
        "already_revoked_at": before,
    }


def _client_key_routes(ctx: ServerContext) -> list[HTTPRouteHandler]:
    """Client API keys: create, list, revoke."""
    operator = [operator_guard(ctx.credentials)]
    limit = MAX_CONTROL_BODY_BYTES

    @post("/allocator/client-keys", status_code=200, guards=operator, request_max_body_size=limit)
    async def create_client_key(data: JSONBody[ClientKeyBody]) -> Response:
        """Create a ``/v1`` client API key; the answer is the only place it appears."""
        keys = _keys(ctx)
        now = time.time()
        key = keys.create(data.name, now)
        entry = next(k for k in keys.public() if k["name"] == data.name)
        return json_response({"name": data.name, "key": key, "id": entry["id"], "created_at": now})

    @get("/allocator/client-keys", guards=operator)
    async def list_client_keys() -> Response:
        """Client keys by name and id (never a key) and whether ``/v1`` requires one."""
        keys = _keys(ctx)
        return json_response({"required": keys.required, "keys": keys.public()})

    @delete(
        "/allocator/client-keys/{name:str}",
        status_code=200,
        guards=operator,
        request_max_body_size=limit,
    )
    async def revoke_client_key(name: FromPath[str]) -> Response:
        """Revoke a client key: requests carrying it are refused from now on."""
        _keys(ctx).revoke(name)
        return json_response({"name": name, "revoked": True})

    return [create_client_key, list_client_keys, revoke_client_key]


def _keys(ctx: ServerContext) -> ClientKeys:
    """The server's client keys (a context built without them gets an open, empty set)."""
    if ctx.client_keys is None:
        ctx.client_keys = ClientKeys(ctx.home)
    return ctx.client_keys


def version_precondition(headers: Mapping[str, str]) -> str | None:
    """The profile version a PUT requires, from its conditional headers.

    Returns:
        The quoted ETag of ``If-Match`` without quotes (``*``: any existing profile),
        ``""`` for ``If-None-Match: *`` (create only), or ``None`` (unconditional).

    Raises:
        ValidationError: both headers, a list of tags, or a weak tag (a profile version is
            exact).
    """
    if_match = headers.get("if-match")
    if_none = headers.get("if-none-match")
    if if_match is not None and if_none is not None:
        msg = "send either If-Match (update the version you read) or If-None-Match: * (create)"
        raise ValidationError(msg)
    if if_none is not None:
        if if_none.strip() != "*":
            msg = "If-None-Match: only '*' (create only) is supported for profiles"
            raise ValidationError(msg)
        return ""
    if if_match is None:
        return None
    tag = if_match.strip()
    if tag == "*":
        return "*"
    if tag.startswith("W/") or "," in tag or len(tag) < 3 or tag[0] != '"' or tag[-1] != '"':
        msg = f"If-Match {tag[:80]!r}: give the one quoted ETag a GET of the profile returned"
        raise ValidationError(msg)
    return tag[1:-1]


async def status_document(ctx: ServerContext, detail: bool) -> dict[str, Any]:
    """Everything status shows: the controller's data plus the server's (no secrets)."""
    now = time.time()
    try:
        controller = await ctx.runner.status(detail)
    except Exception as exc:  # status must stay readable even when the controller fails
        controller = {"error": f"{type(exc).__name__}: {exc}"}
    runner = ctx.runner
    return {
        "mode": runner.mode(),
        "controller": controller,
        "server": {
            "url": ctx.url,
            "ticks": runner.ticks,
            "last_tick_s": runner.last_tick_s,
            "last_error": runner.last_error,
            "dropped_features": runner.dropped_features,
            "warnings": list(ctx.warnings),
            "nodes": ctx.registry.public(now),
            "instance_refusals": list(ctx.registry.instance_refusals),
            "open_breakers": ctx.router.public_breakers(time.monotonic()),
            "inflight_requests": sum(ctx.router.inflight.values()),
            "profiles": sorted(runner.profile_ids),
            "client_keys": {
                "required": bool(ctx.client_keys and ctx.client_keys.required),
                "count": len(ctx.client_keys.public()) if ctx.client_keys else 0,
            },
            "revoked_hosts": ctx.registry.revocations(),
            "state_store": (
                {"kind": "file", "role": "leader"}
                if ctx.leadership is None
                else {"kind": "etcd", **ctx.leadership.status()}
            ),
            "planner_build": {
                "native": PLANNER_BUILD.active,
                "reason": PLANNER_BUILD.reason,
            },
        },
    }
