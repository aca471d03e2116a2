"""The built-in bounded request classifier behind ``grid_classify_request``."""

from __future__ import annotations

import grid_classifier.plugin as builtin
import pytest
from grid_classifier.classify import MAX_SCAN_CHARS, classify
from hypothesis import given, settings
from hypothesis import strategies as st

from grid_core import hookimpl
from grid_core.demand.features import RequestFeatures
from grid_core.testing import plugins_with

VOCAB = (
    "coding",
    "research",
    "marketing",
    "sales",
    "design",
    "image",
    "video",
    "embedding",
    "general",
)


def _f(endpoint: str = "chat", modality: str = "text", units: int = 100) -> RequestFeatures:
    return RequestFeatures(
        at=0.0, endpoint=endpoint, requested_model="auto", modality=modality, input_units=units
    )


@pytest.mark.parametrize(
    ("features", "text", "workload"),
    [
        (_f(), "fix this python function that raises KeyError", "coding"),
        (_f(), "summarize the paper and cite the evidence", "research"),
        (_f(), "three slogans for the spring campaign", "marketing"),
        (_f(), "follow-up email to the prospect with the pricing quote", "sales"),
        (_f(), "what is a polite way to decline", "general"),
        (_f(units=9000), "please have a look", "research"),
        (_f("embeddings", "embedding"), "fix this python function", "embedding"),
        (_f("video", "video"), "a clip of waves", "video"),
        (_f("image", "image"), "photo of a bicycle", "image"),
        (_f("image", "image"), "logo mockup in a muted palette", "design"),
    ],
)
def test_features_and_keywords_decide_the_workload(features, text, workload) -> None:
    assert classify(features, text, VOCAB) == workload


def test_endpoint_and_modality_outrank_keywords() -> None:
    # A code-flavoured caption sent to the image endpoint is still image work.
    assert classify(_f("image", "image"), "python code on a screen", VOCAB) == "image"


def test_the_scan_is_bounded_to_the_prefix() -> None:
    late = " " * MAX_SCAN_CHARS + "python refactor compile"
    assert classify(_f(), late, VOCAB) == "general"
    assert classify(_f(), late.strip(), VOCAB) == "coding"


def test_only_configured_workloads_come_back() -> None:
    assert classify(_f(), "fix this python bug", ("general",)) == "general"
    assert classify(_f("video", "video"), "clip", ("coding", "general")) == "general"
    assert classify(_f(), "fix this python bug", ("research",)) is None


@settings(max_examples=200, deadline=None)
@given(
    endpoint=st.sampled_from(["chat", "completions", "embeddings", "image", "video", "other"]),
    modality=st.sampled_from(["text", "image", "video", "embedding"]),
    text=st.text(max_size=3000),
    vocab=st.lists(st.sampled_from(VOCAB), min_size=1, max_size=9, unique=True),
)
def test_the_answer_is_always_in_the_vocabulary(endpoint, modality, text, vocab) -> None:
    answer = classify(_f(endpoint, modality), text, tuple(vocab))
    assert answer is None or answer in vocab
    if "general" in vocab:
        assert answer is not None


def test_the_hook_answers_through_the_facade_and_yields_to_an_operator_plugin() -> None:
    plugins = plugins_with(("grid_classifier", builtin))
    assert plugins.classify_request(_f(), "refactor the sql query", VOCAB) == "coding"

    class Operator:
        @hookimpl
        def grid_classify_request(self, features, text, vocabulary):
            return "sales"

    both = plugins_with(("grid_classifier", builtin), ("operator", Operator()))
    assert both.classify_request(_f(), "refactor the sql query", VOCAB) == "sales"
