"""``grid bench plan --fleet FILE`` names the entry and the key of a malformed fleet file."""

from __future__ import annotations

import copy

import pytest
from grid_bench.fleet import SCHEMA, fleet_inputs

from grid_core.errors import ValidationError
from grid_core.planner.lastready import SHORTFALL_PERSIST_S

FLEET = {
    "schema": SCHEMA,
    "now": 1767225600.0,
    "hosts": [
        {
            "host_id": "host-001",
            "capacity_mb": 24576,
            "reserved_mb": 6144,
            "runtimes": ["llama.cpp"],
            "backends": ["metal"],
            "failure_domain": "fd-1",
            "tags": [],
            "state": "accepting",
            "max_models": 0,
            "heartbeat_age_s": 2.0,
            "residencies": [
                {"model_id": "model-01", "memory_mb": 4096, "state": "ready", "managed": True}
            ],
        }
    ],
    "models": [
        {
            "model_id": "model-01",
            "memory_mb": 4096,
            "runtimes": ["llama.cpp"],
            "backends": [],
            "min_replicas": 1,
            "max_replicas": 2,
            "priority": 1,
            "min_failure_domains": 1,
        }
    ],
    "demand": [
        {
            "model_id": "model-01",
            "request_rate_per_s": 0.5,
            "service_time_s": 2.0,
            "queue_depth": 0.0,
            "p95_latency_ms": 0.0,
        }
    ],
}


def _refused(path: tuple, value: object) -> pytest.ExceptionInfo[ValidationError]:
    """Plan a copy of :data:`FLEET` with ``value`` at ``path``; the reader must refuse it."""
    data = copy.deepcopy(FLEET)
    *parents, key = path
    entry = data
    for step in parents:
        entry = entry[step]
    entry[key] = value
    with pytest.raises(ValidationError) as exc:
        fleet_inputs(data)
    return exc


def test_a_well_formed_fleet_converts() -> None:
    inputs = fleet_inputs(copy.deepcopy(FLEET))
    assert [h.host_id for h in inputs.hosts] == ["host-001"]
    assert [p.model_id for p in inputs.profiles] == ["model-01"]


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (
            ("hosts", 0, "capacity_mb"),
            "lots",
            "hosts[0] (host-001).capacity_mb is 'lots', not a number",
        ),
        (
            ("hosts", 0, "residencies", 0, "memory_mb"),
            None,
            "hosts[0] (host-001).residencies[0].memory_mb is None",
        ),
        (("models", 0, "priority"), True, "models[0] (model-01).priority is True, not a number"),
        (
            ("models", 0, "runtimes"),
            "llama.cpp",
            "models[0] (model-01).runtimes is 'llama.cpp', not a list",
        ),
        (("demand", 0, "queue_depth"), "0", "demand[0] (model-01).queue_depth is '0'"),
        # Python's json reads Infinity and NaN; the rate once reached math.ceil (exit 1)
        (
            ("demand", 0, "request_rate_per_s"),
            float("inf"),
            "demand[0] (model-01).request_rate_per_s is inf, not a finite number",
        ),
        (
            ("hosts", 0, "capacity_mb"),
            float("nan"),
            "hosts[0] (host-001).capacity_mb is nan, not a finite number",
        ),
        # a misspelt state once planned silently: the host took no new work, the residency
        # held neither memory nor a model slot
        (
            ("hosts", 0, "state"),
            "Accepting",
            "hosts[0] (host-001).state is 'Accepting', not one of accepting, throttled,",
        ),
        (
            ("hosts", 0, "residencies", 0, "state"),
            "running",
            "hosts[0] (host-001).residencies[0].state is 'running', not one of loading, cached,",
        ),
    ],
)
def test_a_wrong_value_names_the_entry_and_the_key(path, value, named) -> None:
    exc = _refused(path, value)
    assert named in str(exc.value) and "regenerate the file" in str(exc.value)
    assert exc.value.exit_code == 2  # a wrong --fleet file, as the exit-code table says


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("hosts", 0, "capacity_mb"), -24576, "hosts[0] (host-001).capacity_mb is -24576"),
        # -1 once read as "no ceiling" on model slots
        (("hosts", 0, "max_models"), -1, "hosts[0] (host-001).max_models is -1"),
        (("hosts", 0, "heartbeat_age_s"), -5.0, "hosts[0] (host-001).heartbeat_age_s is -5.0"),
        (
            ("hosts", 0, "residencies", 0, "memory_mb"),
            -4096,
            "hosts[0] (host-001).residencies[0].memory_mb is -4096",
        ),
        (("demand", 0, "request_rate_per_s"), -0.5, "demand[0] (model-01).request_rate_per_s"),
        (("demand", 0, "queue_depth"), -3, "demand[0] (model-01).queue_depth is -3"),
    ],
)
def test_a_negative_count_size_or_rate_is_refused(path, value, named) -> None:
    exc = _refused(path, value)
    assert named in str(exc.value) and "must be 0 or more" in str(exc.value)


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        # read letter by letter: the model needed the back-ends c, u, d, a and fit no host
        (("models", 0, "backends"), "cuda", "models[0] (model-01).backends is 'cuda', not a list"),
        # once refused as "8 pins exceed max_replicas=2"
        (
            ("models", 0, "pinned_hosts"),
            "host-001",
            "models[0] (model-01).pinned_hosts is 'host-001', not a list of names",
        ),
        # a number inside a list stopped the plan with a traceback (exit 1)
        (("models", 0, "runtimes"), [1], "models[0] (model-01).runtimes is [1], not a list"),
        (("hosts", 0, "tags"), ["fast-disk", None], "hosts[0] (host-001).tags is ['fast-disk',"),
        # fractions were cut off: 2.5 model slots planned as 2
        (("hosts", 0, "max_models"), 2.5, "hosts[0] (host-001).max_models is 2.5, not a whole"),
        (("models", 0, "memory_mb"), 1.9, "models[0] (model-01).memory_mb is 1.9, not a whole"),
        # any non-empty string read as managed
        (
            ("hosts", 0, "residencies", 0, "managed"),
            "no",
            "hosts[0] (host-001).residencies[0].managed is 'no', not true or false",
        ),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused(path, value, named) -> None:
    exc = _refused(path, value)
    assert named in str(exc.value) and "regenerate the file" in str(exc.value)


def test_a_whole_number_written_as_a_float_is_read() -> None:
    data = copy.deepcopy(FLEET)
    data["hosts"][0]["capacity_mb"] = 24576.0
    data["models"][0]["memory_mb"] = 4096.0
    inputs = fleet_inputs(data)
    assert inputs.hosts[0].capacity_mb == 24576
    assert inputs.profiles[0].memory_mb == 4096


def test_reserved_memory_above_capacity_is_refused() -> None:
    data = copy.deepcopy(FLEET)
    data["hosts"][0]["reserved_mb"] = 30000
    with pytest.raises(ValidationError, match=r"hosts\[0\] \(host-001\)\.reserved_mb \(30000\)"):
        fleet_inputs(data)


@pytest.mark.parametrize(("kind", "key"), [("hosts", "host_id"), ("demand", "model_id")])
def test_a_repeated_id_names_both_entries(kind, key) -> None:
    data = copy.deepcopy(FLEET)
    data[kind].append(copy.deepcopy(data[kind][0]))
    with pytest.raises(ValidationError) as exc:
        fleet_inputs(data)
    assert f"{kind}[0] and {kind}[1] share the {key}" in str(exc.value)


def test_two_residencies_of_one_model_on_one_host_are_refused() -> None:
    # the format allows one replica per host; the second entry was planned as a second copy
    data = copy.deepcopy(FLEET)
    residencies = data["hosts"][0]["residencies"]
    residencies.append({**residencies[0], "state": "cached"})
    with pytest.raises(ValidationError) as exc:
        fleet_inputs(data)
    assert (
        "hosts[0] (host-001).residencies[0] and hosts[0] (host-001).residencies[1] share the "
        "model_id 'model-01'" in str(exc.value)
    )


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("hosts", 0, "host_id"), "", "hosts[0].host_id is empty"),
        (("models", 0, "model_id"), "", "models[0].model_id is empty"),
        (("hosts", 0, "failure_domain"), 3, "hosts[0] (host-001).failure_domain is 3, not a name"),
        (("hosts", 0, "failure_domain"), "", "hosts[0] (host-001).failure_domain is '', not a"),
    ],
)
def test_an_empty_id_or_a_domain_that_is_not_a_name_is_refused(path, value, named) -> None:
    assert named in str(_refused(path, value).value)


def test_a_host_without_a_failure_domain_is_read_as_having_none() -> None:
    data = copy.deepcopy(FLEET)
    del data["hosts"][0]["failure_domain"]
    assert fleet_inputs(data).hosts[0].failure_domain is None


def test_a_profile_rule_names_the_catalog_entry() -> None:
    data = copy.deepcopy(FLEET)
    data["models"][0]["min_replicas"] = 3  # above max_replicas 2
    with pytest.raises(ValidationError) as exc:
        fleet_inputs(data)
    message = str(exc.value)
    assert message.startswith("fleet: models[0] (model-01): profile field 'min_replicas/max")
    assert "malformed entry" not in message


def test_a_missing_key_names_the_entry() -> None:
    data = copy.deepcopy(FLEET)
    del data["hosts"][0]["max_models"]
    with pytest.raises(ValidationError, match=r"hosts\[0\] \(host-001\) has no 'max_models'"):
        fleet_inputs(data)


def test_a_fleet_files_shortfall_counts_as_established() -> None:
    """A fleet file is one instant with no history: its shortfall is taken as lasting, so the
    plan shows the steady-state decision (a staged preemption of the lower-priority model's
    last ready replica), not the first-sighting wait (``shortfall_settling``)."""
    from grid_core.api import get_plugins, plan

    data = copy.deepcopy(FLEET)
    second = copy.deepcopy(data["hosts"][0])
    second.update(host_id="host-002", failure_domain="fd-2", max_models=1)
    second["residencies"] = [
        {"model_id": "model-02", "memory_mb": 4096, "state": "ready", "managed": True}
    ]
    data["hosts"][0]["max_models"] = 1
    data["hosts"].append(second)
    low = copy.deepcopy(data["models"][0])
    low.update(model_id="model-02", priority=0, min_replicas=0, max_replicas=1)
    data["models"].append(low)
    data["demand"][0].update(queue_depth=3.0)
    inputs = fleet_inputs(data)
    assert inputs.demand["model-01"].short_since == FLEET["now"] - SHORTFALL_PERSIST_S
    out = plan(inputs, get_plugins().planner_hooks(), reuse=False)
    assert [(e.model_id, e.host_id) for e in out.evictions] == [("model-02", "host-002")]
    assert {u.code for u in out.unmet} == {"preemption_staged"}
