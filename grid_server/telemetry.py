"""Bounded request features for the demand side (never prompts, responses, keys or users).

Source: the specification's "Proactive observation and portfolio planning". The proxy calls
:func:`shape_of` once on the parsed body (bounded scan) and :func:`features` when the request
ends; observation is best effort and never raises into the request path.
"""

from __future__ import annotations

import hashlib

from grid_core.demand.features import EndpointFamily, Modality, Outcome, RequestFeatures

CHARS_PER_TOKEN = 4
"""Rough characters per token: good enough for demand sizing, never used for billing."""
MAX_SCANNED_MESSAGES = 64
"""Messages inspected for size: a long history is sized by its last 64 turns."""
MAX_SCANNED_CHARS = 1_000_000
"""Stop counting characters beyond this; the bucket is 'huge' either way."""
MAX_MODEL_NAME = 200
"""Longest model name kept in features (the wire id limit); longer caller names are cut."""
TEXT_PREFIX_CHARS = 512
"""Text handed to the classifier for its keyword scan; it is dropped right after."""

RETRY_WINDOW_S = 20.0
"""A request refused with 503 and sent again within this long is the same demand, counted
once (issue 16, item 5). It is shorter than the 30 s demand window, so a client still
waiting after it counts once more and keeps the model's direct evidence live."""
MAX_RETRY_ENTRIES = 8192
"""Refused request identities remembered at once; when full, the oldest half is forgotten."""

ENDPOINTS: dict[str, EndpointFamily] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    # A ComfyUI workflow's image route (the grid_comfyui gateway answers it with a PNG).
    "/v1/media/image/generate": "image",
}


class Shape:
    """What the proxy learned about a request body without keeping its text."""

    __slots__ = ("input_units", "max_tokens", "modality", "stream", "text_prefix")

    def __init__(self) -> None:
        self.input_units = 0
        self.max_tokens: int | None = None
        self.modality: Modality = "text"
        self.stream = False
        self.text_prefix = ""


def _content_chars(content: object, shape: Shape) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        n = 0
        for part in content[:MAX_SCANNED_MESSAGES]:
            if isinstance(part, dict):
                kind = part.get("type")
                if kind == "text" and isinstance(part.get("text"), str):
                    n += len(part["text"])
                elif kind in ("image_url", "input_image"):
                    shape.modality = "image"
        return n
    return 0


def shape_of(endpoint: EndpointFamily, body: dict[str, object]) -> Shape:
    """Size, output hint, modality and a transient text prefix of one request body."""
    shape = Shape()
    shape.stream = body.get("stream") is True
    for key in ("max_completion_tokens", "max_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            shape.max_tokens = v
            break
    chars = 0
    text = ""
    if endpoint == "chat":
        msgs = body.get("messages")
        if isinstance(msgs, list):
            for m in msgs[-MAX_SCANNED_MESSAGES:]:
                if isinstance(m, dict):
                    chars += _content_chars(m.get("content"), shape)
                    if m.get("role") == "user" and isinstance(m.get("content"), str):
                        text = m["content"]
                if chars > MAX_SCANNED_CHARS:
                    break
    else:
        raw = body.get("prompt") if endpoint in ("completions", "image") else body.get("input")
        if isinstance(raw, str):
            chars, text = len(raw), raw
        elif isinstance(raw, list):
            chars = sum(len(x) for x in raw[:MAX_SCANNED_MESSAGES] if isinstance(x, str))
        if endpoint == "embeddings":
            shape.modality = "embedding"
        elif endpoint == "image":
            shape.modality = "image"
    shape.input_units = min(chars, MAX_SCANNED_CHARS) // CHARS_PER_TOKEN
    shape.text_prefix = text[:TEXT_PREFIX_CHARS]
    return shape


class RetryLedger:
    """Recognises a client's retry of a request Grid refused with 503.

    A request's identity is a digest of the caller's address, its affinity digest and its
    exact body: the OpenAI clients and typical retry loops resend the identical body. Only
    the digest is kept, for :data:`RETRY_WINDOW_S` from the refusal that was counted.
    """

    def __init__(self) -> None:
        self._counted: dict[bytes, float] = {}

    def __len__(self) -> int:
        return len(self._counted)

    @staticmethod
    def identity(client: str, affinity_hash: str | None, body: bytes) -> bytes:
        """Digest of one request's identity (16 bytes)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(client.encode())
        h.update(b"\0")
        h.update((affinity_hash or "").encode())
        h.update(b"\0")
        h.update(body)
        return h.digest()

    def refused(self, identity: bytes, mono: float) -> bool:
        """Note a 503 for ``identity``; True when it is a retry of one already counted."""
        at = self._counted.get(identity)
        if at is not None and mono - at < RETRY_WINDOW_S:
            return True
        if len(self._counted) >= MAX_RETRY_ENTRIES:
            keep = sorted(self._counted.items(), key=lambda kv: kv[1])[MAX_RETRY_ENTRIES // 2 :]
            self._counted = dict(keep)
        self._counted[identity] = mono
        return False

    def served(self, identity: bytes, mono: float) -> bool:
        """A request was served: True (and forgotten) when its refusal was already counted."""
        at = self._counted.pop(identity, None)
        return at is not None and mono - at < RETRY_WINDOW_S


def features(
    *,
    at: float,
    endpoint: EndpointFamily,
    requested_model: str,
    served_model: str | None,
    shape: Shape,
    output_units: int | None,
    workload: str | None,
    service_time_s: float | None,
    queue_s: float,
    outcome: Outcome,
    affinity_hash: str | None,
    retry: bool = False,
    evaluation: bool = False,
) -> RequestFeatures:
    """Assemble the bounded features of one finished (or refused) request."""
    return RequestFeatures(
        at=at,
        endpoint=endpoint,
        # Caller-chosen names are bounded: an unknown model may be any string.
        requested_model=requested_model[:MAX_MODEL_NAME],
        served_model=served_model,
        modality=shape.modality,
        input_units=shape.input_units,
        output_units=output_units if output_units is not None else (shape.max_tokens or 0),
        workload=workload,
        service_time_s=service_time_s,
        queue_s=queue_s,
        outcome=outcome,
        # Double hash: the router's digest is hashed again so demand state cannot be joined
        # back to routing decisions.
        affinity_hash=_rehash(affinity_hash) if affinity_hash else None,
        retry=retry,
        evaluation=evaluation,
    )


def _rehash(digest: str) -> str:
    return hashlib.sha256(b"grid-demand\0" + digest.encode()).hexdigest()[:32]
