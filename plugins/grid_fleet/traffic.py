"""Real chat requests against the fleet, measured from the client's side.

Every request goes through the public ``/v1/chat/completions`` route exactly as an
application would send it; latency is client-visible wall time including any retries the
client did after an honest ``503`` + ``Retry-After``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TypedDict

import anyio
import httpx

REQUEST_TIMEOUT_S = 300.0
"""One request's budget: a cold CPU engine under full fleet load can take minutes."""
MAX_RETRY_WAIT_S = 2.0
"""Never sleep longer than this between retries, whatever Retry-After says: the demo wants
to see the model the moment it turns ready."""
DEFAULT_RETRY_WAIT_S = 1.0
"""Wait when a 503 carries no usable Retry-After (it always should)."""
PROMPT_WORDS = ("hello", "world", "grid", "model", "reply", "with", "yes", "the", "a", "ok")
"""Words the tiny models' vocabulary has whole, so a prompt of N words is about N tokens."""


@dataclass
class Outcome:
    """What one logical request (with its retries) produced.

    Attributes:
        model: the requested model id.
        status: final HTTP status (0 for a transport error).
        latency_s: client-visible seconds from the first attempt to the final answer.
        attempts: HTTP attempts made (1 + retries after 503).
        first_status / retry_after: the first attempt's status and its Retry-After header.
        response_id / text / prompt_tokens / completion_tokens: from a successful answer.
        error: why it failed (empty on success).
    """

    model: str
    status: int = 0
    latency_s: float = 0.0
    attempts: int = 0
    first_status: int = 0
    retry_after: str | None = None
    response_id: str = ""
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.status == 200


def prompt_of(words: int, salt: int = 0) -> str:
    """A deterministic prompt of about ``words`` tokens."""
    n = max(1, words)
    return " ".join(PROMPT_WORDS[(i + salt) % len(PROMPT_WORDS)] for i in range(n))


def check_answer(doc: object) -> tuple[str, str, int, int, str]:
    """``(id, text, prompt_tokens, completion_tokens, problem)`` of a chat completion."""
    if not isinstance(doc, dict):
        return "", "", 0, 0, "the body is not a JSON object"
    rid = doc.get("id") or ""
    try:
        text = doc["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        text = ""
    usage = doc.get("usage") or {}
    pt = int(usage.get("prompt_tokens") or 0) if isinstance(usage, dict) else 0
    ct = int(usage.get("completion_tokens") or 0) if isinstance(usage, dict) else 0
    problem = ""
    if not rid:
        problem = "no response id"
    elif not text.strip():
        problem = "empty output"
    elif ct <= 0:
        problem = "no usage.completion_tokens"
    return str(rid), text, pt, ct, problem


async def chat(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    *,
    prompt: str,
    max_tokens: int,
    affinity_key: str | None = None,
    retry_until: float | None = None,
) -> Outcome:
    """Send one chat request; on 503 follow Retry-After until ``retry_until`` (monotonic).

    ``ignore_eos`` asks llama-server for exactly ``max_tokens`` tokens, so a random-weight
    tiny model never answers with an empty string by sampling end-of-turn first.
    """
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": prompt}],
    }
    headers = {"X-Grid-Affinity-Key": affinity_key} if affinity_key else {}
    out = Outcome(model=model)
    t0 = time.monotonic()
    while True:
        out.attempts += 1
        try:
            resp = await client.post(
                url + "/v1/chat/completions", json=body, headers=headers, timeout=REQUEST_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            out.status, out.error = 0, f"{type(exc).__name__}: {exc}"[:200]
            break
        if out.attempts == 1:
            out.first_status = resp.status_code
            out.retry_after = resp.headers.get("retry-after")
        out.status = resp.status_code
        if resp.status_code == 503 and retry_until is not None:
            try:
                wait = float(resp.headers.get("retry-after", DEFAULT_RETRY_WAIT_S))
            except ValueError:
                wait = DEFAULT_RETRY_WAIT_S
            wait = min(max(wait, 0.1), MAX_RETRY_WAIT_S)
            if time.monotonic() + wait < retry_until:
                await anyio.sleep(wait)
                continue
        if resp.status_code != 200:
            out.error = f"HTTP {resp.status_code}: {resp.text[:160]}"
            break
        try:
            doc = resp.json()
        except ValueError:
            out.error = "the answer is not JSON"
            break
        rid, text, pt, ct, problem = check_answer(doc)
        out.response_id, out.text, out.prompt_tokens, out.completion_tokens = rid, text, pt, ct
        out.error = problem
        break
    out.latency_s = time.monotonic() - t0
    return out


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) or ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class BatchSummary(TypedDict):
    """What :func:`summarize` reports for a batch (counts of requests, latencies in ms)."""

    requests: int
    served: int
    unavailable_503: int
    other_errors: int
    first_attempt_503s: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    completion_tokens: int


def summarize(outcomes: list[Outcome]) -> BatchSummary:
    """Counts, latency percentiles (ms) and token totals of a batch."""
    lat = [o.latency_s * 1000.0 for o in outcomes if o.ok]
    return {
        "requests": len(outcomes),
        "served": sum(1 for o in outcomes if o.ok),
        "unavailable_503": sum(1 for o in outcomes if not o.ok and o.status == 503),
        "other_errors": sum(1 for o in outcomes if not o.ok and o.status != 503),
        # Requests whose first attempt got 503: the demo then follows Retry-After, the
        # replay does not retry at all, so this counts first attempts, not retries.
        "first_attempt_503s": sum(1 for o in outcomes if o.first_status == 503),
        "p50_ms": percentile(lat, 50),
        "p95_ms": percentile(lat, 95),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat) if lat else None,
        "completion_tokens": sum(o.completion_tokens for o in outcomes),
    }
