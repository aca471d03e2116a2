"""The mutation governor, the action book and the retry fences."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from reconcile_helpers import NOW, deferred, host, kinds, plan, profile, ready, run

from grid_core.reconcile import Action, ActionBook, GovernorPolicy, Proposal, action_id, admit
from grid_core.reconcile.actions import FailureRecord, failure_key


def warm(model: str, host_id: str, **kw: object) -> Proposal:
    base: dict[str, object] = {
        "kind": "warm",
        "host_id": host_id,
        "model_id": model,
        "memory_mb": 1000,
        "reason": "missing_replica",
        "load_first": True,
    }
    base.update(kw)
    return Proposal(**base)  # type: ignore[arg-type]


def order(
    props: list[Proposal], policy: GovernorPolicy | None = None, actions: list[Action] | None = None
) -> list[tuple[str, str]]:
    free = {p.host_id: 100_000 for p in props}
    adm = admit(
        props,
        actions or [],
        free,
        policy or GovernorPolicy(max_global_mutations=99, max_host_mutations=99),
    )
    return [(p.model_id, p.host_id) for p in adm.admitted]


def test_priority_then_class_then_replica_round_then_cold_path() -> None:
    props = [
        warm("low", "h1", priority=0),
        warm("hi2", "h2", priority=2, round=1),
        warm("hi1", "h3", priority=2, round=0, cold_path_s=50.0),
        warm("hi0", "h4", priority=2, round=0, cold_path_s=5.0),
        warm("pred", "h5", priority=2, service_class="predictive"),
        warm("base", "h6", priority=2, service_class="baseline", round=3),
    ]
    assert [m for m, _ in order(props)] == ["base", "hi0", "hi1", "hi2", "pred", "low"]


def test_routine_cleanup_comes_after_all_availability_work_but_preemption_does_not() -> None:
    props = [
        Proposal(
            kind="drain",
            host_id="h1",
            model_id="old",
            reason="obsolete",
            priority=9,
            service_class="cleanup",
        ),
        warm("new", "h2", priority=0),
        Proposal(
            kind="drain",
            host_id="h3",
            model_id="victim",
            reason="eviction",
            priority=5,
            service_class="direct",
            eviction=True,
        ),
    ]
    assert [m for m, _ in order(props)] == ["victim", "new", "old"]


def test_global_and_per_host_limits() -> None:
    props = [warm(f"m{i}", f"h{i % 3}") for i in range(6)]
    adm = admit(
        props,
        [],
        {f"h{i}": 100_000 for i in range(3)},
        GovernorPolicy(max_global_mutations=2, max_host_mutations=1),
    )
    assert len(adm.admitted) == 2 and len({p.host_id for p in adm.admitted}) == 2
    assert {d.reason for d in adm.deferred} == {"global_mutation_limit", "host_mutation_limit"}


def test_exact_artifact_fanout_counts_running_loads_and_spares_other_artifacts() -> None:
    running = [
        Action(
            action_id="x",
            kind="load",
            host_id="h9",
            model_id="a",
            artifact_sha256="c" * 64,
            status="running",
        )
    ]
    props = [warm("a", f"h{i}", artifact_sha256="c" * 64) for i in range(3)]
    props.append(warm("b", "h5", artifact_sha256="d" * 64))
    adm = admit(
        props,
        running,
        {f"h{i}": 10_000 for i in range(10)},
        GovernorPolicy(max_global_mutations=99),
    )
    assert sorted((p.model_id, p.host_id) for p in adm.admitted) == [("a", "h0"), ("b", "h5")]
    assert [d.reason for d in adm.deferred] == ["artifact_fanout", "artifact_fanout"]


def test_memory_is_claimed_once_per_tick() -> None:
    adm = admit(
        [warm("a", "h1", memory_mb=6000), warm("b", "h1", memory_mb=6000)],
        [],
        {"h1": 10_000},
        GovernorPolicy(max_host_mutations=5),
    )
    assert [p.model_id for p in adm.admitted] == ["a"]
    assert adm.deferred[0].reason == "awaiting_memory"


def test_a_higher_class_displaces_only_an_undelivered_lower_class_action() -> None:
    def holder(aid: str, delivered: bool) -> list[Action]:
        return [
            Action(
                action_id=aid,
                kind="warm",
                host_id="h1",
                model_id="low",
                priority=0,
                delivered_at=NOW if delivered else None,
                memory_mb=1000,
            )
        ]

    policy = GovernorPolicy(max_global_mutations=1, max_host_mutations=1)
    urgent = warm("urgent", "h1", priority=3)
    adm = admit([urgent], holder("u1", False), {"h1": 50_000}, policy)
    assert adm.preempted == ["u1"] and [p.model_id for p in adm.admitted] == ["urgent"]
    adm = admit([urgent], holder("d1", True), {"h1": 50_000}, policy)
    assert adm.preempted == [] and adm.admitted == []
    # Equal class is never churned just to reorder.
    adm = admit([warm("peer", "h1", priority=0)], holder("u2", False), {"h1": 50_000}, policy)
    assert adm.preempted == []


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from(["h1", "h2"]),
            st.integers(0, 3),
            st.integers(500, 9000),
        ),
        max_size=12,
    )
)
def test_admission_never_exceeds_any_bound(items: list[tuple[str, str, int, int]]) -> None:
    props = [warm(m, h, priority=p, memory_mb=mb) for m, h, p, mb in items]
    policy = GovernorPolicy(max_global_mutations=3, max_host_mutations=2, artifact_fanout=1)
    free = {"h1": 10_000, "h2": 6_000}
    adm = admit(props, [], free, policy)
    assert len(adm.admitted) <= 3
    for h in free:
        mine = [p for p in adm.admitted if p.host_id == h]
        assert len(mine) <= 2
        assert sum(p.memory_mb for p in mine) <= free[h]
    for m in "abc":
        assert sum(1 for p in adm.admitted if p.model_id == m) <= 1
    assert len(adm.admitted) + len(adm.deferred) == len(props)


# --- action book ------------------------------------------------------------------------
def test_action_ids_are_stable_and_derived_from_identity() -> None:
    a = action_id("warm", "h1", "m", None, "e:1:d")
    assert a == action_id("warm", "h1", "m", None, "e:1:d")
    assert (
        len(
            {
                a,
                action_id("drain", "h1", "m", None, "e:1:d"),
                action_id("warm", "h2", "m", None, "e:1:d"),
                action_id("warm", "h1", "m", "f" * 64, "e:1:d"),
                action_id("warm", "h1", "m", None, "e:2:d"),
            }
        )
        == 5
    )


def test_pending_equivalent_suppresses_a_new_action() -> None:
    book = ActionBook()
    assert book.add(Action(action_id="1", kind="warm", host_id="h", model_id="m"))
    assert not book.add(Action(action_id="2", kind="warm", host_id="h", model_id="m"))
    assert not book.add(Action(action_id="1", kind="warm", host_id="h", model_id="m"))
    assert book.add(Action(action_id="3", kind="load", host_id="h", model_id="m"))


def test_receipts_duplicates_conflicts_and_wrong_hosts() -> None:
    book = ActionBook([Action(action_id="1", kind="warm", host_id="h", model_id="m")])
    assert book.acknowledge("x", "1", "succeeded", NOW) == "wrong_host"
    assert book.acknowledge("h", "nope", "succeeded", NOW) == "unknown"
    assert book.acknowledge("h", "1", "running", NOW) == "applied"
    assert book.acknowledge("h", "1", "running", NOW) == "duplicate"
    assert book.acknowledge("h", "1", "failed", NOW) == "applied"
    assert book.acknowledge("h", "1", "failed", NOW) == "duplicate"
    assert book.acknowledge("h", "1", "succeeded", NOW) == "conflict"
    assert book.get("1").status == "failed"  # type: ignore[union-attr]
    assert book.failures[failure_key("warm", "h", "m")].count == 1


# --- fences on re-issue -----------------------------------------------------------------
def test_a_snapshot_older_than_a_success_cannot_repeat_it_but_a_newer_one_can() -> None:
    done = Action(
        action_id="w",
        kind="warm",
        host_id="h1",
        model_id="a",
        status="succeeded",
        completed_at=NOW - 5,
        receipt_at=NOW - 5,
    )
    book = ActionBook([done])
    stale = host("h1", heartbeat_age_s=20.0)  # reported 20 s ago, before the receipt
    assert (
        deferred(run(plan({"a": ["h1"]}), [stale], [profile("a")], book=book))[("warm", "h1", "a")]
        == "awaiting_observation"
    )
    # A newer report that shows the weights cached proves the old lifecycle ended.
    fresh = host("h1", 16_000, ready("a", state="cached"), heartbeat_age_s=1.0)
    assert kinds(run(plan({"a": ["h1"]}), [fresh], [profile("a")], book=book)) == [
        ("warm", "h1", "a")
    ]


def test_failure_backoff_is_per_kind_host_and_model() -> None:
    book = ActionBook(
        failures={failure_key("warm", "h1", "a"): FailureRecord(count=3, last_at=NOW - 30)}
    )
    r = run(
        plan({"a": ["h1", "h2"]}),
        [host("h1"), host("h2")],
        [profile("a", max_replicas=2)],
        book=book,
    )
    assert deferred(r)[("warm", "h1", "a")] == "backoff"  # 15 * 2**2 = 60 s not yet over
    assert kinds(r) == [("warm", "h2", "a")]
    later = run(plan({"a": ["h1"]}), [host("h1")], [profile("a")], book=book, now=NOW + 31)
    assert kinds(later) == [("warm", "h1", "a")]


def test_delivery_puts_a_later_higher_class_before_an_older_lower_one_fifo_otherwise() -> None:
    from grid_core.reconcile.delivery import select

    acts = [
        Action(action_id="old-low", kind="warm", host_id="h1", model_id="a", order=1),
        Action(action_id="new-high", kind="warm", host_id="h1", model_id="b", order=5, priority=3),
        Action(action_id="old-high", kind="warm", host_id="h1", model_id="c", order=2, priority=3),
    ]
    got = select(
        acts,
        host("h1"),
        NOW,
        GovernorPolicy(),
        availability_ok=True,
        destructive_ok=True,
        blocked_models=frozenset(),
    )
    assert [a.action_id for a in got] == ["old-high", "new-high", "old-low"]


def test_a_preemption_wave_releases_drained_capacity_before_starting_new_drains() -> None:
    props = [
        Proposal(
            kind="drain", host_id="h1", model_id="v1", reason="eviction", priority=4, eviction=True
        ),
        Proposal(
            kind="unload", host_id="h2", model_id="v2", reason="eviction", priority=4, eviction=True
        ),
    ]
    assert order(props) == [("v2", "h2"), ("v1", "h1")]
