"""The built-in bounded request classifier.

It maps one request's bounded features (endpoint family, modality, approximate units) and a
short text prefix to one workload of the operator's vocabulary. The text is scanned once, at
request time, for a fixed set of keywords; only the returned workload name survives (the
specification's "Proactive observation and portfolio planning": raw prompts are never kept).

Decision order: endpoint/modality decide embedding, video and image work outright (a design
brief sent to an image endpoint is ``design`` when its keywords say so); text requests are
scored by keyword hits per workload; ties go to the vocabulary's order; no hit falls back to
``general`` when configured.
"""

from __future__ import annotations

import re

from grid_core.api import RequestFeatures

MAX_SCAN_CHARS = 1024
"""Prefix scanned for keywords: a request's opening states its intent; scanning more costs
time on the request path and adds little signal."""
MAX_SCAN_WORDS = 200
"""Upper bound on words looked at, whatever their length."""
MIN_HITS = 1
"""One clear keyword is enough: the vocabulary is small and the keywords are specific."""
LONG_CONTEXT_UNITS = 4000
"""Very long inputs with no other signal read as research (documents, papers)."""
FALLBACK = "general"

KEYWORDS: dict[str, frozenset[str]] = {
    "coding": frozenset(
        {
            "python",
            "function",
            "def",
            "bug",
            "compile",
            "compiler",
            "refactor",
            "sql",
            "query",
            "unit",
            "test",
            "stack",
            "trace",
            "exception",
            "keyerror",
            "typeerror",
            "class",
            "module",
            "api",
            "regex",
            "git",
            "merge",
            "javascript",
            "rust",
            "code",
            "debug",
        }
    ),
    "research": frozenset(
        {
            "paper",
            "papers",
            "study",
            "studies",
            "evidence",
            "cite",
            "citations",
            "citation",
            "literature",
            "methodology",
            "research",
            "findings",
            "hypothesis",
            "survey",
        }
    ),
    "marketing": frozenset(
        {
            "campaign",
            "slogan",
            "slogans",
            "brand",
            "audience",
            "launch",
            "newsletter",
            "ad",
            "copy",
            "social",
            "tagline",
            "seo",
        }
    ),
    "sales": frozenset(
        {
            "prospect",
            "deal",
            "pipeline",
            "quote",
            "pricing",
            "crm",
            "customer",
            "renewal",
            "discount",
            "objection",
            "follow-up",
            "lead",
            "demo",
        }
    ),
    "design": frozenset(
        {
            "logo",
            "mockup",
            "wireframe",
            "layout",
            "palette",
            "typography",
            "poster",
            "vector",
            "icon",
            "branding",
        }
    ),
}
"""Keywords per text/image workload; lower-case whole words."""

_WORD = re.compile(r"[a-z0-9][a-z0-9_+#-]*")


def keyword_hits(text: str) -> dict[str, int]:
    """Keyword hits per workload in the bounded prefix of ``text`` (the text is not kept)."""
    words = _WORD.findall(text[:MAX_SCAN_CHARS].lower())[:MAX_SCAN_WORDS]
    hits: dict[str, int] = {}
    for w in words:
        for workload, keys in KEYWORDS.items():
            if w in keys:
                hits[workload] = hits.get(workload, 0) + 1
    return hits


def _best(
    hits: dict[str, int], vocabulary: tuple[str, ...], allowed: tuple[str, ...] | None = None
) -> str | None:
    best, best_hits = None, MIN_HITS - 1
    for w in vocabulary:  # vocabulary order breaks ties deterministically
        if allowed is not None and w not in allowed:
            continue
        n = hits.get(w, 0)
        if n > best_hits:
            best, best_hits = w, n
    return best


def classify(features: RequestFeatures, text: str, vocabulary: tuple[str, ...]) -> str | None:
    """One workload of ``vocabulary`` for this request, or ``None`` when none fits.

    Args:
        features: bounded request features.
        text: a transient text prefix (at most :data:`MAX_SCAN_CHARS` are looked at).
        vocabulary: the configured workloads.

    Returns:
        A member of ``vocabulary``; ``None`` only when neither a match nor ``general`` is
        configured.
    """
    vocab = tuple(vocabulary)
    if features.endpoint == "embeddings" or features.modality == "embedding":
        return "embedding" if "embedding" in vocab else _fallback(vocab)
    if features.endpoint == "video" or features.modality == "video":
        return "video" if "video" in vocab else _fallback(vocab)
    hits = keyword_hits(text)
    if features.endpoint == "image" or features.modality == "image":
        if hits.get("design", 0) and "design" in vocab:
            return "design"
        return "image" if "image" in vocab else _fallback(vocab)
    text_only = tuple(w for w in vocab if w not in ("embedding", "video", "image", "design"))
    chosen = _best(hits, vocab, text_only)
    if chosen is not None:
        return chosen
    if features.input_units >= LONG_CONTEXT_UNITS and "research" in vocab:
        return "research"
    return _fallback(vocab)


def _fallback(vocab: tuple[str, ...]) -> str | None:
    return FALLBACK if FALLBACK in vocab else None
