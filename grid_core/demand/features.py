"""Bounded request features: all the demand side ever learns about one request.

The server derives these at the end of every request (or failure). No prompt, response,
tool argument, API key or user identity is kept; the affinity key arrives already hashed.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import msgspec

# The workload vocabulary lives beside the profiles that score it; re-exported for classifiers.
from grid_core.profile import WORKLOADS as WORKLOADS

EndpointFamily = Literal["chat", "completions", "embeddings", "image", "video", "other"]
Modality = Literal["text", "image", "video", "embedding"]
Outcome = Literal["ok", "error", "rejected", "unavailable", "client_error"]
"""ok = 2xx; error = transport/5xx from the engine; rejected = 429; unavailable = Grid's own
503 (no ready route); client_error = caller-caused 4xx (never counts against an engine)."""

MAX_KEYWORD_HITS = 16
"""Keyword hits kept per request: enough for a classifier, never the text itself."""


class RequestFeatures(msgspec.Struct, frozen=True, kw_only=True):
    """One finished request's bounded features.

    Attributes:
        at: completion time (server wall clock, Unix seconds).
        endpoint: endpoint family.
        requested_model: model named by the caller (``auto`` for unbound work).
        served_model: model that served it, if any.
        modality: text, image, video or embedding.
        input_units: approximate input size (tokens ≈ characters / 4, or images).
        output_units: approximate output size (completion tokens, or max_tokens hint).
        workload: classifier output from the configured vocabulary, if classified.
        keyword_hits: workload-vocabulary keywords seen by the bounded scan (not the text).
        service_time_s: time the engine spent (seconds), ``None`` when never routed.
        queue_s: time spent waiting before routing (seconds).
        outcome: see :data:`Outcome`.
        affinity_hash: double hash of ``X-Grid-Affinity-Key`` (never the raw key).
        retry: the same request was already counted as demand within the retry window (a
            client retrying after 503): it adds service evidence but no new request.
        evaluation: the operator marked it as an evaluation (``X-Grid-Evaluation`` with the
            operator capability): engine performance still learns from it, demand never does.
    """

    at: float
    endpoint: EndpointFamily
    requested_model: str
    served_model: str | None = None
    modality: Modality = "text"
    input_units: int = 0
    output_units: int = 0
    workload: str | None = None
    keyword_hits: tuple[str, ...] = ()
    service_time_s: float | None = None
    queue_s: float = 0.0
    outcome: Outcome = "ok"
    affinity_hash: str | None = None
    retry: bool = False
    evaluation: bool = False


@runtime_checkable
class RequestClassifier(Protocol):
    """Names one request's workload (``grid_classify_request``, firstresult)."""

    def __call__(
        self, features: RequestFeatures, text: str, vocabulary: tuple[str, ...]
    ) -> str | None:
        """One element of ``vocabulary``, or ``None`` to let the next classifier answer.

        Args:
            features: the request's bounded features.
            text: a bounded prefix of the request's text; the classifier must not keep it.
            vocabulary: the configured workloads (e.g. :data:`WORKLOADS`).
        """
        ...
