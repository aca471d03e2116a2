"""The Ollama runtime adapter: model memory of a loopback Ollama service, one gateway each.

Ollama is a service Grid does not start; Grid controls which models it keeps in memory
through its documented API and serves each resident model through a Grid-owned gateway
process (:mod:`grid_ollama.gateway`):

* **load** — the model's identity is Ollama's registry digest (``/api/tags``). A present tag
  must carry the declared digest; an absent one is pulled only from an exact
  ``ollama://<tag>`` source with a declared digest, and a tag that exists with another digest
  is never pulled over (an Ollama pull silently replaces a tag);
* **warm** — ``/api/generate`` with no prompt, ``keep_alive: -1`` and the pinned ``num_ctx``
  loads the model; ``/api/ps`` must then list it; then the gateway starts;
* **drain/unload** — the gateway's in-flight count; after the gateway stops, ``keep_alive: 0``
  unloads the model and ``/api/ps`` must no longer list it.

The service must listen on loopback: it has no authentication, so only the gateway (which
checks the engine key) may be reachable from the network (specification, "Operations":
Ollama and ComfyUI stay bound to loopback).
"""

from __future__ import annotations

import os

import httpx

from grid_core.api import (
    ArtifactSpec,
    ChildRecord,
    GatewayAdapter,
    LoadResult,
    NotFoundError,
    RuntimeHost,
    UnavailableError,
    ValidationError,
)

RUNTIME_NAME = "ollama"
URL_ENV = "GRID_OLLAMA_URL"
"""Base URL of the loopback Ollama service (default Ollama's own 127.0.0.1:11434)."""
DEFAULT_URL = "http://127.0.0.1:11434"
NUM_CTX_ENV = "GRID_OLLAMA_NUM_CTX"
DEFAULT_NUM_CTX = 4096
"""Context (tokens) a Grid-placed Ollama model is loaded with and pinned to."""
SOURCE_PREFIX = "ollama://"
READY_TIMEOUT_S = 120.0
"""Seconds for the gateway to answer once Ollama holds the model (a Python start-up)."""
LOAD_TIMEOUT_S = 600.0
"""Seconds Ollama may take to load a model into memory, or to pull it."""
MAX_CONCURRENCY = 4
"""Requests one Ollama model serves in parallel (Ollama's OLLAMA_NUM_PARALLEL default)."""
LOOPBACK_EXAMPLE = "http://127.0.0.1:11434"
"""Quoted when a non-loopback service URL is refused."""


class OllamaAdapter(GatewayAdapter):
    """Runtime adapter for a loopback Ollama service.

    Args:
        url: the service URL (else ``$GRID_OLLAMA_URL``, else 127.0.0.1:11434).
        num_ctx: context size every resident model is pinned to (else
            ``$GRID_OLLAMA_NUM_CTX``, else 4096).
        ready_timeout_s: seconds the gateway may take to answer.
    """

    name = RUNTIME_NAME
    label = "Ollama gateway"
    gateway_module = "grid_ollama.gateway"
    service = "Ollama"
    url_env = URL_ENV
    default_url = DEFAULT_URL
    loopback_example = LOOPBACK_EXAMPLE

    def __init__(
        self,
        url: str | None = None,
        num_ctx: int | None = None,
        *,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        super().__init__(url, ready_timeout_s=ready_timeout_s, max_concurrency=MAX_CONCURRENCY)
        self.num_ctx = num_ctx or int(os.environ.get(NUM_CTX_ENV) or DEFAULT_NUM_CTX)

    async def tags(self) -> dict[str, dict]:
        """Local tags → their ``/api/tags`` row.

        Raises:
            NotFoundError: the service does not answer (one line saying what is missing).
        """
        try:
            async with self.service_client() as c:
                r = await c.get("/api/tags")
                r.raise_for_status()
                rows = r.json().get("models", [])
        except (httpx.HTTPError, ValueError) as exc:
            msg = (
                f"Ollama is not running at {self.url} ({type(exc).__name__}); start "
                f"'ollama serve' or set {URL_ENV}"
            )
            raise NotFoundError(msg) from None
        return {str(row.get("name")): row for row in rows}

    async def inventory(self) -> str:
        """What this host offers for Ollama (raises NotFoundError when it is not running)."""
        tags = await self.tags()
        return f"ollama {self.url}: {len(tags)} local model(s)"

    # --- load -------------------------------------------------------------------------------
    async def load(self, host: RuntimeHost, artifact: ArtifactSpec) -> LoadResult:
        """Verify the tag's registry digest, or pull an absent tag from its exact source.

        Raises:
            ValidationError: the local digest differs from the declared one, or the source
                is not ``ollama://<this tag>``, or a pull produced another digest.
            NotFoundError: absent without a source, or Ollama is not running.
        """
        tag = artifact.model_id
        local = (await self.tags()).get(_canonical(tag))
        if local is not None:
            return self._verified(tag, local, artifact.sha256, fetched=False)
        if artifact.source is None:
            msg = (
                f"{tag}: not in Ollama at {self.url}; run 'ollama pull {tag}' or give the "
                f"profile --artifact-source {SOURCE_PREFIX}{tag} and its --artifact-sha256"
            )
            raise NotFoundError(msg)
        if artifact.source != f"{SOURCE_PREFIX}{tag}" or artifact.sha256 is None:
            msg = (
                f"{tag}: an Ollama pull needs --artifact-source {SOURCE_PREFIX}{tag} exactly and "
                "the registry digest as --artifact-sha256"
            )
            raise ValidationError(msg)
        async with self.service_client(LOAD_TIMEOUT_S) as c:
            r = await c.post("/api/pull", json={"model": tag, "stream": False})
        if r.status_code != 200:
            msg = f"{tag}: ollama pull failed (HTTP {r.status_code}: {r.text[:200]})"
            raise UnavailableError(msg)
        pulled = (await self.tags()).get(_canonical(tag))
        if pulled is None:
            msg = f"{tag}: ollama pull reported success but the tag is not listed"
            raise UnavailableError(msg)
        return self._verified(tag, pulled, artifact.sha256, fetched=True)

    @staticmethod
    def _verified(tag: str, row: dict, sha256: str | None, *, fetched: bool) -> LoadResult:
        digest = str(row.get("digest", "")).removeprefix("sha256:")
        if sha256 is not None and digest != sha256:
            msg = (
                f"{tag}: Ollama holds digest {digest}, the profile declares {sha256}; Grid never "
                "replaces an existing tag — fix --artifact-sha256 or re-tag by hand"
            )
            raise ValidationError(msg)
        return LoadResult(
            model_id=tag,
            path=f"{SOURCE_PREFIX}{tag}",
            sha256=sha256 if sha256 is not None else None,
            size_bytes=int(row.get("size", 0)),
            fetched=fetched,
        )

    # --- warm -------------------------------------------------------------------------------
    async def loaded(self, tag: str) -> dict | None:
        """The model's ``/api/ps`` row, ``None`` when not in memory."""
        async with self.service_client() as c:
            r = await c.get("/api/ps")
            r.raise_for_status()
        for row in r.json().get("models", []):
            if row.get("name") == _canonical(tag):
                return dict(row)
        return None

    async def before_spawn(self, host: RuntimeHost, loaded: LoadResult, memory_mb: int) -> None:
        """Re-check the digest, then load the model pinned (keep_alive -1, fixed num_ctx).

        Raises:
            UnavailableError: Ollama refused the load or does not list the model afterwards.
        """
        await self.load(host, ArtifactSpec(model_id=loaded.model_id, sha256=loaded.sha256))
        body = {"model": loaded.model_id, "keep_alive": -1, "options": {"num_ctx": self.num_ctx}}
        try:
            async with self.service_client(LOAD_TIMEOUT_S) as c:
                r = await c.post("/api/generate", json=body)
            if r.status_code != 200:
                msg = f"Ollama refused to load {loaded.model_id}: HTTP {r.status_code} {r.text}"
                raise UnavailableError(msg[:300])
            if await self.loaded(loaded.model_id) is None:
                msg = f"Ollama answered the load of {loaded.model_id} but /api/ps does not list it"
                raise UnavailableError(msg)
        except httpx.HTTPError as exc:
            msg = f"Ollama at {self.url} failed during the load of {loaded.model_id}: {exc}"
            raise UnavailableError(msg) from None

    def gateway_args(self, loaded: LoadResult) -> list[str]:
        """The context size the gateway pins every request to."""
        return ["--num-ctx", str(self.num_ctx)]

    async def after_stop(self, host: RuntimeHost, child: ChildRecord) -> None:
        """Unload the model from Ollama (``keep_alive: 0``) and check ``/api/ps``.

        Raises:
            UnavailableError: Ollama still lists the model (the unload is retried later).
        """
        try:
            async with self.service_client(LOAD_TIMEOUT_S) as c:
                await c.post("/api/generate", json={"model": child.alias, "keep_alive": 0})
            still = await self.loaded(child.alias)
        except httpx.HTTPError as exc:
            msg = f"gateway stopped, but Ollama did not confirm unloading {child.alias}: {exc}"
            raise UnavailableError(msg) from None
        if still is not None:
            msg = f"gateway stopped, but Ollama still holds {child.alias} in memory"
            raise UnavailableError(msg)

    # --- qualification ------------------------------------------------------------------------
    async def infer(self, host: RuntimeHost, child: ChildRecord) -> str:
        """One real chat completion through the gateway (qualification)."""
        async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
            r = await client.post(
                f"{child.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {host.api_key}"},
                json={
                    "model": child.alias,
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Reply with OK"}],
                },
            )
        tokens = (
            r.json().get("usage", {}).get("completion_tokens", 0) if r.status_code == 200 else 0
        )
        if not tokens:
            msg = f"chat completion on {child.alias}: HTTP {r.status_code}, no tokens"
            raise ValidationError(msg)
        return f"HTTP 200, {tokens} tokens"


def _canonical(tag: str) -> str:
    """Ollama's full tag name (``name`` means ``name:latest``)."""
    return tag if ":" in tag else f"{tag}:latest"
