"""Builders shared by the planner tests (small fleets, explicit numbers)."""

from __future__ import annotations

from grid_core.demand.types import ModelDemand
from grid_core.planner import Plan, PlanInputs, PlannerPolicy, canonical_inputs, plan
from grid_core.planner.chains import CHAIN_PLAN_BUDGET
from grid_core.planner.core import PlanState
from grid_core.planner.exchange import BUMP_BUDGET, EXCHANGE_BUDGET
from grid_core.profile import ModelProfile, validate_profile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot
from grid_core.testing import plugins_with

NOW = 1_800_000_000.0
GB = 1024

PLUGINS = plugins_with(builtins=("grid_scoring", "grid_victims"))


def host(host_id: str, capacity_gb: float = 16, **kw: object) -> HostSnapshot:
    """An accepting llama.cpp host with a fresh heartbeat and no reserve/headroom surprises."""
    base: dict[str, object] = {
        "host_id": host_id,
        "capacity_mb": int(capacity_gb * GB),
        "runtimes": ("llama.cpp",),
        "heartbeat_age_s": 1.0,
        "failure_domain": "fd-1",
    }
    base.update(kw)
    return HostSnapshot(**base)  # type: ignore[arg-type]


def model(model_id: str, memory_gb: float = 4, **kw: object) -> ModelProfile:
    base: dict[str, object] = {"model_id": model_id, "memory_mb": int(memory_gb * GB)}
    base.update(kw)
    return validate_profile(ModelProfile(**base))  # type: ignore[arg-type]


def cuda_host(host_id: str, gb: float, **kw: object) -> HostSnapshot:
    """A GPU server: llama.cpp and vLLM on CUDA."""
    return host(host_id, gb, runtimes=("llama.cpp", "vllm"), backends=("cuda",), **kw)


def mac_host(host_id: str, gb: float, **kw: object) -> HostSnapshot:
    """A Mac: llama.cpp on Metal."""
    return host(host_id, gb, backends=("metal",), **kw)


def vllm_model(model_id: str, gb: float, **kw: object) -> ModelProfile:
    """A model only vLLM on CUDA runs."""
    return model(model_id, gb, runtimes=("vllm",), backends=("cuda",), **kw)


CHAIN_HOSTS = [
    cuda_host("a-cuda-1slot", 22, max_models=1),
    cuda_host("b-cuda-2slot", 36, max_models=2),
    mac_host("m-mac-2slot", 16, max_models=2),
    mac_host("n-mac-1slot", 8, max_models=1),
]
"""Two GPU servers and two Macs with model ceilings: the ejection-chain fleet."""
CHAIN_MODELS = [
    model("big", 20, max_replicas=1),
    vllm_model("c8", 8),
    vllm_model("c20", 20),
    model("g10", 10),
    model("g6", 6),
    model("g4", 4),
]
"""A 20 GB GGUF model that fits only where a chain of moves makes room, and its neighbours."""


def res(
    model_id: str, memory_gb: float = 4, state: str = "ready", **kw: object
) -> ResidencySnapshot:
    base: dict[str, object] = {
        "model_id": model_id,
        "memory_mb": int(memory_gb * GB),
        "state": state,
        "active_requests": 0,
        "loaded_at": NOW - 3600.0,
    }
    base.update(kw)
    return ResidencySnapshot(**base)  # type: ignore[arg-type]


def demand(model_id: str, replicas: int, **kw: object) -> ModelDemand:
    base: dict[str, object] = {"model_id": model_id, "desired_replicas": replicas, "direct": True}
    base.update(kw)
    return ModelDemand(**base)  # type: ignore[arg-type]


POLICY = PlannerPolicy(admission_headroom_mb=0, admission_headroom_fraction=0.0)
"""Zero headroom keeps the arithmetic of hand-written cases exact; headroom has its own test."""


def run(
    profiles, hosts, demands=(), policy: PlannerPolicy = POLICY, now: float = NOW, plugins=PLUGINS
) -> Plan:
    inputs = PlanInputs(
        now=now,
        profiles=tuple(profiles),
        hosts=tuple(hosts),
        demand={d.model_id: d for d in demands},
        policy=policy,
    )
    return plan(inputs, plugins.planner_hooks(), reuse=False)


def placed(p: Plan) -> set[tuple[str, str]]:
    return {(a.model_id, a.host_id) for a in p.assignments}


def codes(p: Plan, model_id: str | None = None) -> list[str]:
    return [u.code for u in p.unmet if model_id is None or u.model_id == model_id]


def layout_state(
    hosts: list[HostSnapshot],
    models: list[ModelProfile],
    layout: list[tuple[str, str]],
    wants: dict[str, int],
    *,
    live: tuple[str, str] | None = None,
    spent: bool = True,
    inferred: tuple[str, ...] = (),
) -> PlanState:
    """A plan state (for the repair passes) with ``layout``'s (model, host) new replicas
    placed, ``live`` (model, host) kept as an incumbent, ``wants`` replicas wanted per model
    (direct demand, or demand only inferred for the models in ``inferred``) and, with
    ``spent``, the shared repair budgets used up as the classes above leave them on a large
    fleet."""
    inputs = canonical_inputs(
        PlanInputs(
            now=NOW,
            profiles=tuple(models),
            hosts=tuple(hosts),
            demand={
                m: demand(m, n, direct=False, inferred_rps=1.0) if m in inferred else demand(m, n)
                for m, n in wants.items()
            },
            policy=POLICY,
        )
    )
    state = PlanState(inputs, [], None)
    by_host = {h.host_id: hi for hi, h in enumerate(state.hosts)}
    for mid, hid in layout:
        mi, hi = state.ledger.index[mid], by_host[hid]
        assert state.ledger.fit_new(mi, hi) is None
        state.ledger.place(mi, hi, "score")
    if live is not None:
        mid, hid = live
        hi = by_host[hid]
        state.ledger.keep(state.ledger.index[mid], hi, state.hosts[hi].residencies[0], "incumbent")
    if spent:
        state.repair_steps = state.policy.repair_budget
        state.chain_steps = CHAIN_PLAN_BUDGET
        state.exchange_steps = EXCHANGE_BUDGET
        state.bump_trials = BUMP_BUDGET
    return state


def state_where(state: PlanState) -> set[tuple[str, str]]:
    """(model id, host id) of every replica the plan state holds."""
    return {
        (state.profiles[pl.mi].model_id, state.hosts[pl.hi].host_id)
        for pl in state.ledger.placements()
    }
