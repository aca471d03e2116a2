"""The node side of a gateway runtime: a loopback service served through Grid gateways.

For a service Grid does not start and that has no authentication (Ollama, ComfyUI), the
resident model is one Grid gateway child (:mod:`grid_core.system.gateway`) in front of the
loopback service. :class:`GatewayAdapter` is the part every such runtime adapter shares on
top of :class:`~grid_core.system.engine_child.EngineChildAdapter`: the loopback-only service
URL, the gateway's command line and identity flags, and its readiness and activity probes. A
runtime supplies the service-side steps (load, warm, release) and its gateway's own flags.

An edge module beside :mod:`grid_core.client` (whose loopback rule it applies), not inside
:mod:`grid_core.system`, which the client itself builds on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from grid_core.client import is_loopback_host
from grid_core.errors import ValidationError
from grid_core.runtime import ChildRecord, LoadResult, RuntimeHost
from grid_core.system.engine_child import PROBE_TIMEOUT_S, EngineChildAdapter, lists_model
from grid_core.system.spawn import SAFE_PATH_FLAG


def check_loopback_service(url: str, *, env: str, service: str, example: str) -> str:
    """``url`` without a trailing slash, refusing a service that is not on loopback.

    Args:
        url: the service's base URL.
        env: the environment variable that sets it (named in the error).
        service: the service's name (``Ollama``).
        example: how to make it listen on loopback (quoted in the error).

    Raises:
        ValidationError: the host is not a loopback address.
    """
    if not is_loopback_host(urlsplit(url).hostname or ""):
        msg = (
            f"{env}={url!r}: {service} has no authentication and must listen on loopback "
            f"(e.g. {example}); Grid serves it to the network through its gateway"
        )
        raise ValidationError(msg)
    return url.rstrip("/")


class GatewayAdapter(EngineChildAdapter):
    """Base of a runtime adapter whose resident model is a Grid gateway to a loopback service.

    Subclasses set :attr:`name`, :attr:`label`, :attr:`gateway_module`, :attr:`service`,
    :attr:`url_env`, :attr:`default_url` and :attr:`loopback_example`, implement
    :meth:`gateway_args`, and extend :meth:`before_spawn` / :meth:`after_stop` with the
    service-side load and release.

    Args:
        url: the service URL (else ``$<url_env>``, else :attr:`default_url`).
        ready_timeout_s: seconds the gateway may take to answer.
        max_concurrency: requests one model serves in parallel.
    """

    gateway_module: str
    """The gateway module, run as ``python -m <gateway_module>`` (``grid_ollama.gateway``)."""
    service: str
    """The service's name in messages (``Ollama``)."""
    url_env: str
    """Environment variable naming the service URL (``GRID_OLLAMA_URL``)."""
    default_url: str
    """The service's own default loopback URL."""
    loopback_example: str
    """How to make the service listen on loopback, for the refusal message."""

    def __init__(
        self, url: str | None = None, *, ready_timeout_s: float, max_concurrency: int | None
    ) -> None:
        super().__init__(ready_timeout_s=ready_timeout_s, max_concurrency=max_concurrency)
        self._url = url

    @property
    def url(self) -> str:
        """The loopback service URL.

        Raises:
            ValidationError: the configured URL is not on loopback.
        """
        return check_loopback_service(
            self._url or os.environ.get(self.url_env) or self.default_url,
            env=self.url_env,
            service=self.service,
            example=self.loopback_example,
        )

    def service_client(self, timeout: float = PROBE_TIMEOUT_S) -> httpx.AsyncClient:
        """An HTTP client on the service's URL (``timeout`` in seconds; no proxy from env)."""
        return httpx.AsyncClient(base_url=self.url, timeout=timeout, trust_env=False)

    def gateway_args(self, loaded: LoadResult) -> list[str]:
        """The runtime's own gateway flags after the shared ones (none by default)."""
        return []

    def command(
        self, host: RuntimeHost, loaded: LoadResult, alias: str, port: int, memory_mb: int
    ) -> list[str]:
        """The gateway for ``alias`` (key read from the 0600 key file)."""
        return [
            str(Path(sys.executable).absolute()),
            SAFE_PATH_FLAG,
            "-m",
            self.gateway_module,
            "--model",
            alias,
            "--host",
            host.bind_host,
            "--port",
            str(port),
            "--api-key-file",
            str(host.api_key_file),
            "--upstream",
            self.url,
            *self.gateway_args(loaded),
        ]

    def identity_args(self, child: ChildRecord) -> tuple[tuple[str, str], ...]:
        """The gateway module, its model and its port."""
        return (
            ("-m", self.gateway_module),
            ("--model", child.alias),
            ("--port", str(child.port)),
        )

    async def ready(self, client: httpx.AsyncClient, host: RuntimeHost, child: ChildRecord) -> bool:
        """The gateway's ``/health`` (the service can serve the model) and model route."""
        return await lists_model(client, child.url, host.api_key, child.alias)

    async def activity(self, host: RuntimeHost, child: ChildRecord) -> int | None:
        """Requests in flight through the gateway (``GET /grid/activity``)."""
        try:
            async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, trust_env=False) as c:
                r = await c.get(
                    f"{child.url}/grid/activity",
                    headers={"Authorization": f"Bearer {host.api_key}"},
                )
            return int(r.json()["active"]) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
