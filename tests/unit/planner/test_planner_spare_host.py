"""Which host a complete plan leaves empty: the specialised one, so scale-out still fits.

Source: specification, "Global placement loop" (the future-compatible host set; best fit and
hardware priors only break cold ties; cached weights rank above them).
"""

from __future__ import annotations

import msgspec
from planner_helpers import codes, demand, host, model, placed, res, run

from grid_core.snapshot import HostSnapshot, ResidencySnapshot

GPU = host("gpu", 24, runtimes=("llama.cpp", "comfyui"), backends=("cuda",), max_models=1)
"""A GPU server every model here can use."""
MEDIA = host("media", 48, runtimes=("comfyui",), backends=("cuda",), max_models=1)
"""A media server only the ComfyUI model can use."""
MAC = host("mac", 20, backends=("metal",), max_models=1)
"""A Mac only the text model can use (its tightest fit)."""
VIDEO = model("video", 20, runtimes=("comfyui",), backends=("cuda",), min_replicas=1)
CODER = model("coder", 16, max_replicas=4, priority=10)
"""The coding model, in a higher class: placed before video, so no price for still-unplaced
demand speaks for the GPU server when video chooses."""


def test_the_specialised_host_takes_the_new_replica_so_the_general_host_stays_spare():
    first = run([VIDEO, CODER], [GPU, MEDIA, MAC], [demand("coder", 1)])
    # best fit alone would put video on the tighter GPU server and leave the media server
    # empty; the media server is the one only video can use
    assert placed(first) == {("video", "media"), ("coder", "mac")}

    # a later tick: both replicas are live where the plan put them and coding needs a second
    # replica; the spare GPU server takes it
    hosts = [GPU, _with(MEDIA, res("video", 20)), _with(MAC, res("coder", 16))]
    later = run([VIDEO, CODER], hosts, [demand("coder", 2)])
    assert placed(later) == {("video", "media"), ("coder", "mac"), ("coder", "gpu")}
    assert codes(later) == []


def test_without_the_spare_host_the_second_coding_replica_has_nowhere_to_go():
    # the layout best fit alone picks: video live on the GPU server
    hosts = [_with(GPU, res("video", 20)), MEDIA, _with(MAC, res("coder", 16))]
    later = run([VIDEO, CODER], hosts, [demand("coder", 2)])
    assert ("coder", "gpu") not in placed(later)
    assert codes(later, "coder") != []


def test_cached_weights_are_not_given_up_to_keep_a_host_spare():
    sha = "cd" * 32
    video = model(
        "video", 20, runtimes=("comfyui",), backends=("cuda",), min_replicas=1, artifact_sha256=sha
    )
    gpu = _copy(GPU, cached={"video": sha})
    p = run([video, CODER], [gpu, MEDIA, MAC], [demand("coder", 1)])
    assert placed(p) == {("video", "gpu"), ("coder", "mac")}


def test_a_host_no_other_model_fits_is_not_worth_keeping_spare():
    # the text model is too large for the GPU server: freeing it helps nobody, so video
    # keeps the tighter fit
    big = model("coder", 30, max_replicas=4, priority=10)
    mac = host("mac", 48, backends=("metal",), max_models=1)
    p = run([VIDEO, big], [GPU, MEDIA, mac], [demand("coder", 1)])
    assert placed(p) == {("video", "gpu"), ("coder", "mac")}


def _with(h: HostSnapshot, *residencies: ResidencySnapshot) -> HostSnapshot:
    return _copy(h, residencies=residencies)


def _copy(h: HostSnapshot, **changes: object) -> HostSnapshot:
    return msgspec.structs.replace(h, **changes)


def test_a_replica_is_not_moved_where_it_would_serve_fewer_requests_at_once():
    # video serves four jobs at once on the GPU server but only two on the media server:
    # serving capacity is not a tie-break, so video keeps the GPU server
    video = model(
        "video",
        20,
        runtimes=("comfyui",),
        backends=("cuda",),
        min_replicas=1,
        replica_concurrency=4,
    )
    gpu, media = _copy(GPU, concurrency=8), _copy(MEDIA, concurrency=2)
    p = run([video, CODER], [gpu, media, MAC], [demand("coder", 1)])
    assert placed(p) == {("video", "gpu"), ("coder", "mac")}
