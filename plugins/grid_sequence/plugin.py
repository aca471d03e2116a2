"""Built-in ``grid_infer_demand``: learned workflows and co-activation as inferred demand.

Source: specification, "Proactive observation and portfolio planning" (affinity-key sequence
proof) and "Global placement loop" (model co-activation). The decisions live in the core
(:func:`grid_core.api.infer_demand`) so the scenario lab and the controller run the same
rules; this plugin is the default answer (``trylast``), and disabling it by entry-point name
(``GRID_DISABLE_PLUGINS=grid_sequence``) turns prediction off, which is what the lab's
``reactive`` control does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grid_core.api import (
    CoActivationBook,
    InferredDemand,
    ModelDemand,
    SequenceBook,
    hookimpl,
    infer_demand,
)


@hookimpl(trylast=True)
def grid_infer_demand(
    sequences: SequenceBook,
    coactivation: CoActivationBook,
    demand: Mapping[str, ModelDemand],
    workload_models: Mapping[str, str],
    now: float,
) -> Sequence[InferredDemand] | None:
    """Answer with the core's sequence and co-activation inference."""
    return infer_demand(sequences, coactivation, demand, workload_models, now)
