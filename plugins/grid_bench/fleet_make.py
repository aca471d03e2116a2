"""``grid bench fleet``: write a seeded synthetic fleet in the ``grid-bench-fleet/1`` format.

So an operator can time the planner (``grid bench plan``, ``grid bench tick``) without any
file from outside Grid. The shape is a mixed office fleet: Macs of 24, 64 and 192 GB and
CUDA servers of 32 and 96 GB, with two or three model slots (the 192 GB Macs have no model
ceiling), three failure domains, one host in ten paused; a catalogue of GGUF and vLLM models
of 2-40 GB with random replica ranges, priorities 0-3 and domain spreads; and, at
``occupancy`` above 0, managed and external residencies already filling that share of each
host's memory. The same arguments always give the same bytes.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from grid_bench.fleet import SCHEMA
from grid_core.api import ValidationError, write_atomic

MAX_HOSTS = 4096
"""Largest fleet ``grid bench fleet`` writes (hosts); the planner benches go to 1,024."""
MAX_MODELS = 512
"""Largest catalogue ``grid bench fleet`` writes (models)."""
GB_MB = 1024
HOST_KINDS = ((24, "mac", 2), (32, "cuda", 2), (64, "mac", 3), (96, "cuda", 3), (192, "mac", 0))
"""(memory GB, platform, model slots; 0 = no ceiling) of the host kinds, drawn uniformly."""
HOST_RESERVED_MB = 4 * GB_MB
"""Memory each host keeps for its owner (MB)."""
FAILURE_DOMAINS = 3
VLLM_SHARE = 0.3
"""Share of the catalogue that is vLLM (CUDA only); the rest is llama.cpp (any host)."""
MANAGED_SHARE = 0.9
"""Share of pre-existing residencies that Grid manages (the rest are external engines)."""
FLEET_CLOCK = 1_767_225_600.0
"""The fleet's ``now`` (Unix s): fixed, so a file is the same whenever it is written."""


def make_fleet(hosts: int, models: int, seed: int, occupancy: float) -> dict[str, Any]:
    """A seeded fleet document (``grid-bench-fleet/1``) of ``hosts`` hosts and ``models``.

    Args:
        hosts: 1..MAX_HOSTS.
        models: 1..MAX_MODELS.
        seed: any integer; the same arguments give the same document.
        occupancy: 0..1, the share of each host's allocatable memory already held by
            residencies (as many as fit its slots).

    Raises:
        ValidationError: an argument out of range (names it and the range).
    """
    _check_range("--hosts", hosts, 1, MAX_HOSTS)
    _check_range("--models", models, 1, MAX_MODELS)
    if not 0.0 <= occupancy <= 1.0:
        msg = f"--occupancy {occupancy}: use a share from 0 to 1"
        raise ValidationError(msg)
    rng = random.Random(seed)
    catalog = [_model(rng, i) for i in range(models)]
    fleet_hosts = [_host(rng, i, catalog, occupancy) for i in range(hosts)]
    demand = [
        {
            "model_id": m["model_id"],
            "request_rate_per_s": rng.choice([0.0, 0.5, 3.0]),
            "queue_depth": rng.choice([0, 0, 4]),
            "p95_latency_ms": 0.0,
            "service_time_s": 2.0,
        }
        for m in catalog
    ]
    return {
        "schema": SCHEMA,
        "now": FLEET_CLOCK,
        "params": {
            "hosts": hosts,
            "models": models,
            "seed": seed,
            "occupancy": occupancy,
            "load": 1.0,
        },
        "hosts": fleet_hosts,
        "models": catalog,
        "demand": demand,
    }


def _check_range(flag: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        msg = f"{flag} {value}: use {low} to {high}"
        raise ValidationError(msg)


def _model(rng: random.Random, i: int) -> dict[str, Any]:
    vllm = rng.random() < VLLM_SHARE
    memory_mb = rng.randint(2, 40) * GB_MB
    low = rng.choice([0, 1, 1, 2])
    return {
        "model_id": f"model-{i + 1:02d}",
        "memory_mb": memory_mb,
        "runtimes": ["vllm"] if vllm else ["llama.cpp"],
        "backends": ["cuda"] if vllm else [],
        "min_replicas": low,
        "max_replicas": max(low, rng.randint(2, 6)),
        "priority": rng.randint(0, 3),
        "min_failure_domains": rng.choice([1, 1, 2]),
        "required_tags": [],
        "pinned_hosts": [],
    }


def _host(
    rng: random.Random, i: int, catalog: list[dict[str, Any]], occupancy: float
) -> dict[str, Any]:
    cap, platform, slots = rng.choice(HOST_KINDS)
    h: dict[str, Any] = {
        "host_id": f"host-{i + 1:03d}",
        "capacity_mb": cap * GB_MB,
        "reserved_mb": HOST_RESERVED_MB,
        "runtimes": ["llama.cpp", "vllm"] if platform == "cuda" else ["llama.cpp"],
        "backends": ["cuda"] if platform == "cuda" else ["metal"],
        "failure_domain": f"fd-{i % FAILURE_DOMAINS + 1}",
        "tags": [],
        "state": rng.choice(["accepting"] * 9 + ["paused"]),
        "max_models": slots,
        "heartbeat_age_s": 2.0,
        "residencies": [],
    }
    budget = occupancy * (h["capacity_mb"] - h["reserved_mb"])
    for m in rng.sample(catalog, len(catalog)):
        runs = set(m["runtimes"]) & set(h["runtimes"]) and (
            not m["backends"] or set(m["backends"]) & set(h["backends"])
        )
        if runs and m["memory_mb"] <= budget and (not slots or len(h["residencies"]) < slots):
            budget -= m["memory_mb"]
            h["residencies"].append(
                {
                    "model_id": m["model_id"],
                    "memory_mb": m["memory_mb"],
                    "state": "ready",
                    "managed": rng.random() < MANAGED_SHARE,
                    "active_requests": 0,
                }
            )
    h["residencies"].sort(key=lambda r: r["model_id"])
    return h


def bench_fleet(
    hosts: Annotated[int, typer.Option("--hosts", min=1, max=MAX_HOSTS, help="Hosts.")] = 64,
    models: Annotated[int, typer.Option("--models", min=1, max=MAX_MODELS, help="Models.")] = 32,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 1,
    occupancy: Annotated[
        float,
        typer.Option("--occupancy", min=0.0, max=1.0, help="Share of host memory already in use."),
    ] = 0.0,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="File to write (owner-only, atomic); default stdout."),
    ] = None,
) -> None:
    """Write a seeded synthetic fleet (grid-bench-fleet/1) for grid bench plan and tick.

    An ``--out`` in a missing directory, or naming a directory, is refused (exit 2) before
    anything is written."""
    doc = make_fleet(hosts, models, seed, occupancy)
    text = json.dumps(doc, indent=1) + "\n"
    if out is None:
        sys.stdout.write(text)
        return
    if not out.parent.is_dir():
        msg = f"--out: directory '{out.parent}' does not exist; create it or write elsewhere"
        raise ValidationError(msg)
    if out.is_dir():
        msg = f"--out: '{out}' is a directory; name a file in it, e.g. '{out / 'fleet.json'}'"
        raise ValidationError(msg)
    write_atomic(out, text)
    typer.echo(f"grid: wrote {out} ({hosts} hosts, {models} models, seed {seed})", err=True)
