"""``explain``: the binding constraint and a verdict per host, from the plan the planner made."""

from __future__ import annotations

from planner_helpers import POLICY, demand, host, model, res, run

from grid_core.planner.explain import explain


def _explain(model_id, profiles, hosts, demands=()):
    plan = run(profiles, hosts, demands)
    d = {x.model_id: x for x in demands}.get(model_id)
    return explain(model_id, list(profiles), list(hosts), plan, d, POLICY)


def _verdicts(e):
    return {v.host_id: (v.verdict, v.reason) for v in e.hosts}


def test_a_model_blocked_by_model_slots_names_slots():
    profiles = [model("busy", 2, min_replicas=1), model("cold", 2, min_replicas=1)]
    hosts = [host("h1", 16, max_models=1, residencies=(res("busy", 2),))]
    e = _explain("cold", profiles, hosts)
    assert e.binding == "slots"
    assert _verdicts(e) == {"h1": ("rejected", "slots")}
    assert e.desired == 1 and e.placed == 0
    assert "slot" in e.hosts[0].detail and "bound by slots" in e.summary


def test_a_model_blocked_by_memory_names_memory_and_the_numbers():
    profiles = [model("big", 12, min_replicas=1), model("small", 6, min_replicas=1)]
    hosts = [host("h1", 16, residencies=(res("small", 6),)), host("h2", 8)]
    e = _explain("big", profiles, hosts)
    assert e.binding == "memory"
    verdicts = _verdicts(e)
    assert verdicts == {"h1": ("rejected", "memory"), "h2": ("rejected", "memory")}
    h1 = next(v for v in e.hosts if v.host_id == "h1")
    assert "needs 12288 MB" in h1.detail and h1.free_mb == 10 * 1024
    # Too small even before headroom: the detail's two figures say which one the row shows.
    h2 = next(v for v in e.hosts if v.host_id == "h2")
    assert "allocatable left after the plan" in h2.detail, h2.detail
    assert f"({h2.free_mb} MB of it free for a new replica" in h2.detail, h2.detail


def test_a_pinned_model_whose_pin_host_lacks_room_names_the_pin():
    profiles = [
        model("resident", 10, min_replicas=1, priority=5, pins=("h1",)),
        model("pinned", 10, min_replicas=1, pins=("h1",)),
    ]
    hosts = [host("h1", 16, residencies=(res("resident", 10),)), host("h2", 64)]
    e = _explain("pinned", profiles, hosts)
    assert e.binding == "pin"
    verdicts = _verdicts(e)
    # A pin is a floor: the demand is served elsewhere, the pinned host lacks memory.
    assert verdicts["h1"] == ("rejected", "memory")
    assert verdicts["h2"][0] == "placed"
    h1 = next(v for v in e.hosts if v.host_id == "h1")
    assert h1.detail.startswith("its pinned host")
    assert [(u.code, u.host_id) for u in e.unmet] == [("pin_unavailable", "h1")]
    assert "pinned to 'h1'" in e.summary


def test_a_model_whose_hosts_are_protected_names_protection():
    profiles = [model("m", 2, min_replicas=1)]
    hosts = [host("h1", 16, state="paused"), host("h2", 16, state="draining")]
    e = _explain("m", profiles, hosts)
    assert e.binding == "protection"
    verdicts = _verdicts(e)
    assert verdicts == {
        "h1": ("ineligible", "state:paused"),
        "h2": ("ineligible", "state:draining"),
    }
    assert "protection state is 'paused'" in next(v.detail for v in e.hosts if v.host_id == "h1")


def test_a_placed_model_has_no_binding_and_lists_where_and_why_not_elsewhere():
    profiles = [model("m", 2, min_replicas=1)]
    hosts = [host("h1", 16, residencies=(res("m", 2),)), host("h2", 16), host("h3", 16, tags=())]
    e = _explain("m", profiles, hosts, [demand("m", 1, request_rate_rps=0.5)])
    assert e.binding is None and e.placed == 1 == e.desired
    verdicts = _verdicts(e)
    assert verdicts["h1"] == ("kept", "incumbent")
    assert verdicts["h2"][0] == "fits" and verdicts["h3"][0] == "fits"
    assert e.demand is not None and e.demand.request_rate_rps == 0.5


def test_an_unknown_model_is_explained_as_having_no_profile():
    e = explain("nope", [model("m", 2)], [host("h1")], None, None, POLICY)
    assert not e.configured and e.binding == "profile"
    assert "grid allocator model set" in e.summary


def test_a_staged_eviction_is_bound_by_what_the_hosts_lack():
    # Both hosts hold the baseline model in their only slot: the planner stages an
    # eviction, which names the model slot it frees; the hosts' refusals say slots too.
    profiles = [model("busy", 1, min_replicas=1), model("cold", 1, min_replicas=1)]
    hosts = [
        host("h1", 16, max_models=1, residencies=(res("busy", 1),)),
        host("h2", 16, max_models=1, residencies=(res("busy", 1),)),
    ]
    e = _explain("cold", profiles, hosts)
    assert [u.code for u in e.unmet] == ["preemption_staged"]
    assert e.binding == "slots"
