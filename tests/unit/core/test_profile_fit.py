"""A profile against the fleet that exists: unknown runtimes and unplaceable values are said.

The operator's ``grid allocator model set`` used to accept, with exit 0 and no word, a runtime
no plugin provides, a pin to a host that never registered, and more required replicas than
hosts that can run the model.
"""

from __future__ import annotations

from grid_core.profile import ModelProfile
from grid_core.profile_fit import fit_warnings, known_runtimes, oversized, runtime_warnings
from grid_core.snapshot import HostSnapshot


def _host(host_id: str, *runtimes: str) -> HostSnapshot:
    return HostSnapshot(host_id=host_id, capacity_mb=16_000, runtimes=runtimes or ("llama.cpp",))


HOSTS = [_host("h1"), _host("h2"), _host("h3", "echo")]
LLAMA = ("llama.cpp",)


def test_unknown_runtime_is_said_naming_the_field_and_the_known_names() -> None:
    known = known_runtimes(installed={"grid-demo"}, hosts=HOSTS)
    assert {"llama.cpp", "vllm", "grid-demo", "echo"} <= known
    typo = ModelProfile(model_id="m", memory_mb=100, runtimes=("lama.cpp",))
    (warning,) = runtime_warnings(typo, known)
    assert warning.startswith("runtimes: 'lama.cpp' is not provided by any plugin")
    assert "llama.cpp" in warning and "stays unplaced until a host offers it" in warning
    sized = ModelProfile(model_id="m", memory_mb=100, runtime_memory_mb={"vlm": 10})
    assert runtime_warnings(sized, known)[0].startswith("runtime_memory_mb: 'vlm'")
    # Built in, provided by a server plugin, or offered by a registered host: nothing said.
    for rt in ("vllm", "grid-demo", "echo"):
        assert (
            runtime_warnings(ModelProfile(model_id="m", memory_mb=100, runtimes=(rt,)), known) == []
        )


def test_pin_to_an_unregistered_host_is_accepted_with_a_warning() -> None:
    p = ModelProfile(model_id="m", memory_mb=100, max_replicas=2, pins=("h1", "h9"))
    (warning,) = fit_warnings(p, HOSTS)
    assert warning.startswith("pins: host 'h9' is not registered")
    assert fit_warnings(ModelProfile(model_id="m", memory_mb=100, pins=("h1",)), HOSTS) == []


def test_more_required_replicas_than_able_hosts_is_accepted_with_a_warning() -> None:
    # Two hosts run llama.cpp; h3 offers only echo.
    p = ModelProfile(model_id="m", memory_mb=100, min_replicas=3, max_replicas=3)
    (warning,) = fit_warnings(p, HOSTS)
    assert warning.startswith("min_replicas: 3 required replica(s)")
    assert "llama.cpp" in warning and "2 registered host(s) can" in warning
    ok = ModelProfile(model_id="m", memory_mb=100, min_replicas=2, max_replicas=3)
    assert fit_warnings(ok, HOSTS) == []
    assert len(fit_warnings(ok, [])) == 1  # no host registered yet: said, not refused


def test_a_profile_excluded_by_tags_says_which_tags_the_hosts_carry() -> None:
    # The hosts run llama.cpp, so the runtime is not the problem: the line must say what
    # the excluding fields compare with (the tags and backends the hosts have), not only the
    # runtimes they offer.
    tagged = [
        HostSnapshot(
            host_id="h1", capacity_mb=16_000, runtimes=LLAMA, tags=("office",), backends=("metal",)
        ),
        HostSnapshot(host_id="h2", capacity_mb=16_000, runtimes=LLAMA, tags=("lab", "office")),
    ]
    p = ModelProfile(model_id="m", memory_mb=100, required_tags=("gpu-room",))
    (warning,) = fit_warnings(p, tagged)
    assert warning.startswith(
        "required_tags: none of the 2 registered host(s) can run it "
        "(they offer llama.cpp; tags: lab, office)"
    )
    cuda = ModelProfile(model_id="m", memory_mb=100, backends=("cuda",))
    assert "(they offer llama.cpp; backends: metal)" in fit_warnings(cuda, tagged)[0]
    gpu = ModelProfile(model_id="m", memory_mb=100, min_gpu_count=1)
    assert "(they offer llama.cpp; most GPUs on one host: 0)" in fit_warnings(gpu, tagged)[0]
    bare = [HostSnapshot(host_id="h1", capacity_mb=16_000, runtimes=LLAMA)]
    assert "(they offer llama.cpp; tags: none)" in fit_warnings(p, bare)[0]


def test_a_replica_larger_than_every_host_that_can_run_it_is_said() -> None:
    # h1 and h2 (16,000 MB, one with a 1,000 MB reserve) run llama.cpp; h3 only echo.
    hosts = [HOSTS[0], HostSnapshot(host_id="h2", capacity_mb=16_000, reserved_mb=1_000), HOSTS[2]]
    (warning,) = fit_warnings(ModelProfile(model_id="m", memory_mb=20_000), hosts)
    assert warning.startswith("memory_mb: one replica needs 20000 MB")
    assert "h1, 16000 MB" in warning and "lower memory_mb" in warning
    assert oversized(ModelProfile(model_id="m", memory_mb=16_000), hosts) is None
    # A runtime-specific estimate that fits counts; a host that cannot run it does not.
    small_echo = ModelProfile(
        model_id="m", memory_mb=20_000, runtimes=("echo",), runtime_memory_mb={"echo": 8_000}
    )
    assert oversized(small_echo, hosts) is None
    assert (
        oversized(ModelProfile(model_id="m", memory_mb=20_000, runtimes=("vllm",)), hosts) is None
    )


def test_a_profile_no_registered_host_can_run_is_said_even_without_min_replicas() -> None:
    known = known_runtimes(installed=(), hosts=HOSTS)
    vllm = ModelProfile(model_id="m", memory_mb=100, runtimes=("vllm",))
    (warning,) = fit_warnings(vllm, HOSTS, known)
    assert warning.startswith("runtimes: none of the 3 registered host(s) can run it")
    assert "(they offer echo, llama.cpp)" in warning and "model_unplaceable" in warning
    quantum = ModelProfile(model_id="m", memory_mb=100, backends=("quantum",))
    assert fit_warnings(quantum, HOSTS, known)[0].startswith("backends, runtimes: none of")
    # Said elsewhere or not at all: an unknown runtime name (runtime_warnings), a required
    # replica count (its own line), no host registered yet, a host that can run it.
    typo = ModelProfile(model_id="m", memory_mb=100, runtimes=("lama.cpp",))
    assert fit_warnings(typo, HOSTS, known) == []
    required = ModelProfile(model_id="m", memory_mb=100, runtimes=("vllm",), min_replicas=1)
    assert [w.split(":")[0] for w in fit_warnings(required, HOSTS, known)] == ["min_replicas"]
    assert fit_warnings(vllm, [], known) == []
    assert fit_warnings(ModelProfile(model_id="m", memory_mb=100), HOSTS, known) == []


def test_while_hosts_are_still_registering_the_warning_names_the_503_a_request_gets() -> None:
    known = known_runtimes(installed=(), hosts=HOSTS)
    vllm = ModelProfile(model_id="m", memory_mb=100, runtimes=("vllm",))
    (warning,) = fit_warnings(vllm, HOSTS, known, registering_s=41.2)
    assert "for the next 42 s a request for it gets model_not_ready, then model_unplaceable" in (
        warning
    )
    (after,) = fit_warnings(vllm, HOSTS, known, registering_s=0.0)
    assert "fails with model_unplaceable" in after and "model_not_ready" not in after
