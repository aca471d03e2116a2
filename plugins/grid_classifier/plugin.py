"""Entry point of the grid_classifier plugin: the built-in bounded request classifier.

Registered ``trylast`` so an operator's own classifier plugin answers first.
"""

from __future__ import annotations

from grid_classifier.classify import classify
from grid_core.api import RequestFeatures, hookimpl


@hookimpl(trylast=True)
def grid_classify_request(
    features: RequestFeatures, text: str, vocabulary: tuple[str, ...]
) -> str | None:
    """Map bounded features and a transient text prefix to one workload of ``vocabulary``."""
    if not vocabulary:
        return None
    return classify(features, text or "", tuple(vocabulary))
