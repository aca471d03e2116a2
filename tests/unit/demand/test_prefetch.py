"""The predictive cache: cache-only advisories, the disk floor, TTL, 2x replacement, two
generations."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from grid_core.demand.inference import InferredDemand
from grid_core.demand.prefetch import (
    MAX_VICTIMS,
    MIN_MATURITY_S,
    PREDICTIVE_FLOOR_MB,
    PREDICTIVE_TTL_S,
    PredictiveEntry,
    PrefetchInputs,
    plan_prefetch,
)
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot

NOW = 1_790_000_000.0
GIB = 1024


def _sha(c: str) -> str:
    return c * 64


def _profile(mid: str, size_mb: int, sha: str, load_s: float = 120.0) -> ModelProfile:
    return ModelProfile(
        model_id=mid,
        memory_mb=1000,
        runtimes=("llama.cpp",),
        artifact_sha256=sha,
        artifact_source=f"https://models.example/{mid}.gguf",
        artifact_size_mb=size_mb,
        load_estimate_s=load_s,
    )


def _host(hid: str = "h1", free_mb: int | None = 50 * GIB, **kw: object) -> HostSnapshot:
    base = HostSnapshot(
        host_id=hid,
        capacity_mb=8000,
        heartbeat_age_s=1.0,
        runtimes=("llama.cpp",),
        artifact_disk_free_mb=free_mb,
        actuator_capabilities=("load", "warm", "drain", "unload", "evict"),
    )
    return msgspec.structs.replace(base, **kw)


def _row(mid: str, confidence: float = 0.9, rate: float = 0.02, lead: float | None = None):  # type: ignore[no-untyped-def]  # test helper
    return InferredDemand(
        model_id=mid,
        kind="sequence",
        edge=f"a→{mid}",
        confidence=confidence,
        support=5,
        rate_rps=rate,
        lead_s=lead,
    )


def test_an_unplaced_prediction_is_fetched_cache_only_with_its_exact_artifact() -> None:
    b = _profile("b", 4 * GIB, _sha("b"))
    d = plan_prefetch(
        PrefetchInputs(now=NOW, predictions=(_row("b"),), profiles={"b": b}, hosts=(_host(),))
    )
    [a] = d.advisories
    assert (a.kind, a.host_id, a.model_id, a.artifact_sha256, a.size_mb) == (
        "fetch",
        "h1",
        "b",
        _sha("b"),
        4 * GIB,
    )
    assert a.reason == "predictive_prefetch" and a.edge == "a→b"


def test_no_advisory_without_an_authorized_source_or_when_already_served() -> None:
    b = msgspec.structs.replace(_profile("b", GIB, _sha("b")), artifact_source=None)
    d = plan_prefetch(
        PrefetchInputs(now=NOW, predictions=(_row("b"),), profiles={"b": b}, hosts=(_host(),))
    )
    assert d.advisories == () and "authorized" in d.refused[0]
    b = _profile("b", GIB, _sha("b"))
    d = plan_prefetch(
        PrefetchInputs(
            now=NOW,
            predictions=(_row("b"),),
            profiles={"b": b},
            hosts=(_host(),),
            served=frozenset({"b"}),
        )
    )
    assert d.advisories == ()


def test_missing_disk_telemetry_never_authorizes_a_transfer() -> None:
    b = _profile("b", GIB, _sha("b"))
    d = plan_prefetch(
        PrefetchInputs(
            now=NOW, predictions=(_row("b"),), profiles={"b": b}, hosts=(_host(free_mb=None),)
        )
    )
    assert d.advisories == ()


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.integers(0, 40 * GIB), min_size=1, max_size=4),
    sizes=st.lists(st.integers(1, 20 * GIB), min_size=1, max_size=4),
    reserved=st.integers(0, 10 * GIB),
    floor=st.sampled_from([PREDICTIVE_FLOOR_MB, 0, 2 * GIB]),
)
def test_a_predicted_transfer_never_takes_free_disk_under_the_floor(
    free: list[int], sizes: list[int], reserved: int, floor: int
) -> None:
    hosts = tuple(_host(f"h{i}", f) for i, f in enumerate(free))
    profiles = {f"m{i}": _profile(f"m{i}", s, _sha(str(i % 10))) for i, s in enumerate(sizes)}
    d = plan_prefetch(
        PrefetchInputs(
            now=NOW,
            predictions=tuple(_row(m) for m in profiles),
            profiles=profiles,
            hosts=hosts,
            reserved_mb={"h0": reserved},
            floor_mb=floor,
            budget=len(profiles),
        )
    )
    left = {h.host_id: (h.artifact_disk_free_mb or 0) for h in hosts}
    left["h0"] -= reserved
    for a in d.advisories:
        assert a.kind == "fetch"
        left[a.host_id] -= a.size_mb
        assert left[a.host_id] >= floor, (a, left)


def test_ranking_uses_value_per_mb_and_lead_time_and_recomputes_the_ledger() -> None:
    # Lead time 5 s: a huge artifact saves at most 5 s; the small one saves its whole fetch.
    big = _profile("big", 30 * GIB, _sha("1"), load_s=600.0)
    small = _profile("small", 2 * GIB, _sha("2"), load_s=60.0)
    host = _host(free_mb=PREDICTIVE_FLOOR_MB + 31 * GIB)
    d = plan_prefetch(
        PrefetchInputs(
            now=NOW,
            predictions=(_row("big", lead=5.0), _row("small", lead=300.0)),
            profiles={"big": big, "small": small},
            hosts=(host,),
        )
    )
    # small first; then big no longer fits above the floor on the same disk.
    assert [a.model_id for a in d.advisories] == ["small"]
    assert any(r.startswith("big:") for r in d.refused)


def _entry(mid: str, size: int, age_s: float, used: bool = False) -> PredictiveEntry:
    return PredictiveEntry(
        host_id="h1",
        model_id=mid,
        artifact_sha256=_sha(mid[0]),
        size_mb=size,
        cached_at=NOW - age_s,
        used=used,
    )


def test_unused_predictive_artifacts_expire_after_the_ttl_and_nothing_else_does() -> None:
    old = _entry("old", GIB, PREDICTIVE_TTL_S)
    young = _entry("young", GIB, PREDICTIVE_TTL_S - 1)
    used = _entry("used", GIB, 2 * PREDICTIVE_TTL_S, used=True)
    wanted = _entry("wanted", GIB, 2 * PREDICTIVE_TTL_S)
    resident = _entry("resident", GIB, 2 * PREDICTIVE_TTL_S)
    swapped = _entry("swapped", GIB, 2 * PREDICTIVE_TTL_S)  # the host now has another SHA
    entries = (old, young, used, wanted, resident, swapped)
    cached = {e.model_id: e.artifact_sha256 for e in entries} | {"swapped": _sha("9")}
    host = _host(
        cached=cached,
        residencies=(ResidencySnapshot(model_id="resident", memory_mb=1000, state="ready"),),
    )
    d = plan_prefetch(
        PrefetchInputs(
            now=NOW,
            predictions=(),
            profiles={},
            hosts=(host,),
            entries=entries,
            demanded=frozenset({"wanted"}),
        )
    )
    assert [(a.kind, a.model_id, a.reason) for a in d.advisories] == [
        ("evict", "old", "predictive_ttl")
    ]
    # A node without the evict actuator is never asked.
    host = msgspec.structs.replace(host, actuator_capabilities=("load", "warm"))
    d = plan_prefetch(
        PrefetchInputs(now=NOW, predictions=(), profiles={}, hosts=(host,), entries=entries)
    )
    assert d.advisories == ()


def _full_disk(entries: tuple[PredictiveEntry, ...], extra_free: int = 0) -> HostSnapshot:
    return _host(
        free_mb=PREDICTIVE_FLOOR_MB + extra_free,
        cached={e.model_id: e.artifact_sha256 for e in entries},
    )


def test_replacement_needs_twice_the_value_per_byte_and_maturity() -> None:
    incoming = _profile("new", 4 * GIB, _sha("n"), load_s=120.0)
    victim = _entry("vic", 4 * GIB, MIN_MATURITY_S)
    vprofile = _profile("vic", 4 * GIB, _sha("v"), load_s=120.0)
    host = _full_disk((victim,))

    def decide(new_conf: float, vic_conf: float, age: float) -> list[tuple[str, str]]:
        e = msgspec.structs.replace(victim, cached_at=NOW - age)
        d = plan_prefetch(
            PrefetchInputs(
                now=NOW,
                predictions=(_row("new", confidence=new_conf), _row("vic", confidence=vic_conf)),
                profiles={"new": incoming, "vic": vprofile},
                hosts=(host,),
                entries=(e,),
                served=frozenset({"vic"}) if vic_conf == 0 else frozenset(),
            )
        )
        return [(a.kind, a.model_id) for a in d.advisories]

    # Equal sizes: value per byte is proportional to confidence here.
    assert decide(0.9, 0.45, MIN_MATURITY_S) == [("evict", "vic")]  # exactly 2x
    assert decide(0.9, 0.46, MIN_MATURITY_S) == []  # under 2x
    assert decide(0.9, 0.1, MIN_MATURITY_S - 1) == []  # not mature yet


def test_two_generations_evict_first_and_fetch_only_after_a_heartbeat_proves_the_space() -> None:
    incoming = _profile("new", 4 * GIB, _sha("n"))
    victim = _entry("vic", 4 * GIB, 2 * MIN_MATURITY_S)
    inputs = PrefetchInputs(
        now=NOW,
        predictions=(_row("new"),),
        profiles={"new": incoming},
        hosts=(_full_disk((victim,)),),
        entries=(victim,),
    )
    first = plan_prefetch(inputs)
    assert [(a.kind, a.model_id, a.reason) for a in first.advisories] == [
        ("evict", "vic", "predictive_replace")
    ]  # no fetch in the same generation: the deletion is not credited as free space
    # The next heartbeat still shows the old disk (eviction not done): still no fetch.
    again = plan_prefetch(inputs)
    assert all(a.kind == "evict" for a in again.advisories)
    # A heartbeat proving the 4 GiB reclaimed: now the fetch is planned.
    proven = msgspec.structs.replace(
        inputs,
        hosts=(_host(free_mb=PREDICTIVE_FLOOR_MB + 4 * GIB),),
        entries=(),
    )
    assert [(a.kind, a.model_id) for a in plan_prefetch(proven).advisories] == [("fetch", "new")]


def test_several_small_victims_are_proven_together_and_capped_at_three() -> None:
    incoming = _profile("new", 4 * GIB, _sha("n"))
    victims = tuple(_entry(f"{c}v", GIB, 2 * MIN_MATURITY_S) for c in "abcd")
    host = _full_disk(victims)
    d = plan_prefetch(
        PrefetchInputs(
            now=NOW,
            predictions=(_row("new"),),
            profiles={"new": incoming},
            hosts=(host,),
            entries=victims,
        )
    )
    assert d.advisories == ()  # four 1 GiB victims would be needed: more than MAX_VICTIMS
    host = _full_disk(victims, extra_free=GIB)
    d = plan_prefetch(
        PrefetchInputs(
            now=NOW,
            predictions=(_row("new"),),
            profiles={"new": incoming},
            hosts=(host,),
            entries=victims,
        )
    )
    assert len(d.advisories) == MAX_VICTIMS and all(a.kind == "evict" for a in d.advisories)


def test_demanded_used_and_resident_artifacts_are_never_victims() -> None:
    incoming = _profile("new", 4 * GIB, _sha("n"))
    used = _entry("used", 4 * GIB, 2 * MIN_MATURITY_S, used=True)
    wanted = _entry("wanted", 4 * GIB, 2 * MIN_MATURITY_S)
    d = plan_prefetch(
        PrefetchInputs(
            now=NOW,
            predictions=(_row("new"),),
            profiles={"new": incoming},
            hosts=(_full_disk((used, wanted)),),
            entries=(used, wanted),
            demanded=frozenset({"wanted"}),
        )
    )
    assert d.advisories == ()


def test_a_throttled_host_is_future_compatible_but_a_draining_or_paused_one_is_not() -> None:
    """The planner still places new work on a throttled host (within its throttled share), so
    a throttled host may take a transfer; a draining or paused one never does."""
    b = _profile("b", 4 * GIB, _sha("b"))
    for state, fetched in (("throttled", True), ("draining", False), ("paused", False)):
        d = plan_prefetch(
            PrefetchInputs(
                now=NOW,
                predictions=(_row("b"),),
                profiles={"b": b},
                hosts=(_host(state=state),),
            )
        )
        assert bool(d.advisories) is fetched, state


def test_the_transfer_goes_to_the_host_where_the_predicted_request_would_start() -> None:
    """Both hosts are full. h1 holds the only replica of a priority-50 baseline, h2 a
    priority-10 filler: the real request for priority-100 ``b`` would preempt the filler on
    h2, so weights cached on h1 would save nothing. The hypothetical plan (the prediction as
    the real request it predicts) names h2, and the transfer goes there."""
    from grid_core.demand.prefetch import prediction_homes
    from grid_core.demand.types import ModelDemand
    from grid_core.planner import plan
    from grid_core.planner.types import PlanInputs
    from grid_core.testing import plugins_with

    hooks = plugins_with(builtins=("grid_scoring", "grid_victims")).planner_hooks()

    def resident(mid: str) -> ResidencySnapshot:
        return ResidencySnapshot(
            model_id=mid,
            memory_mb=5000,
            state="ready",
            active_requests=0,
            loaded_at=NOW - 7200,
            last_used_at=NOW - 7200,
            routable=True,
        )

    base = ModelProfile(model_id="base", memory_mb=5000, min_replicas=1, priority=50)
    filler = ModelProfile(model_id="filler", memory_mb=5000, min_replicas=1, priority=10)
    b = msgspec.structs.replace(_profile("b", 4 * GIB, _sha("b")), memory_mb=5000, priority=100)
    profiles = {p.model_id: p for p in (base, filler, b)}
    hosts = (
        _host("h1", residencies=(resident("base"),)),
        _host("h2", residencies=(resident("filler"),)),
    )
    demand = {
        "base": ModelDemand(model_id="base", desired_replicas=1, reasons=("baseline",)),
        "filler": ModelDemand(model_id="filler", desired_replicas=1, reasons=("baseline",)),
        "b": ModelDemand(model_id="b"),
    }

    def plan_of(d: dict[str, ModelDemand], released: frozenset[tuple[str, str]]):  # type: ignore[no-untyped-def]  # test helper
        del released
        inputs = PlanInputs(now=NOW, profiles=tuple(profiles.values()), hosts=hosts, demand=d)
        return plan(inputs, hooks)

    authoritative = plan_of(demand, frozenset())
    assert "b" not in {a.model_id for a in authoritative.assignments}
    homes = prediction_homes(plan_of, demand, [_row("b")], authoritative.assignments, profiles)
    assert homes == {"b": frozenset({"h2"})}
    inputs = PrefetchInputs(now=NOW, predictions=(_row("b"),), profiles=profiles, hosts=hosts)
    [anywhere] = plan_prefetch(inputs).advisories
    assert anywhere.host_id == "h1"  # without homes the first eligible host wins the tie
    [fetch] = plan_prefetch(msgspec.structs.replace(inputs, homes=homes)).advisories
    assert (fetch.kind, fetch.host_id, fetch.model_id) == ("fetch", "h2", "b")
    # Weights already cached on h1 do not count as cached where the request will start.
    cached_h1 = (msgspec.structs.replace(hosts[0], cached={"b": _sha("b")}), hosts[1])
    [again] = plan_prefetch(
        msgspec.structs.replace(inputs, homes=homes, hosts=cached_h1)
    ).advisories
    assert again.host_id == "h2"
