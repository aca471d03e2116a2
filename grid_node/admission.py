"""Command admission and fencing on the node (specification, "Local wire contract").

A command runs only when every check passes; otherwise the node acknowledges it ``rejected``
with the reason. Authority is checked against the node's own monotonic clock: the deadline is
the instant the heartbeat request was *sent* plus the server's remaining TTL, so the whole
request duration is subtracted and a skewed wall clock can neither extend nor cut authority.
"""

from __future__ import annotations

from grid_core.protection import ProtectionDecision
from grid_core.wire import Command
from grid_node.state import NodeState

CONSTRUCTIVE = frozenset({"load", "warm"})
"""Kinds that start new work; a local protection decision can cancel them."""
DRAINABLE_CHILD_STATES = frozenset({"ready", "draining"})
"""Child states a drain can act on: a serving engine, or one already draining (the same
drain again is harmless). The controller drains only residencies it saw in these states, so
a drain that finds anything else was decided on facts that are no longer true."""


def authority_deadline(sent_mono: float, ttl_s: float) -> float:
    """Monotonic instant after which commands of one response are expired.

    Args:
        sent_mono: node monotonic time just before the heartbeat request was sent.
        ttl_s: ``controller_lease_ttl_seconds`` from the response (server clock domain).
    """
    return sent_mono + ttl_s


def parse_generation(gen: str) -> tuple[str, int] | None:
    """``epoch:sequence:digest`` → ``(epoch, sequence)``; ``None`` when malformed."""
    parts = gen.split(":")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def check(
    cmd: Command,
    *,
    host_id: str,
    node_id: str,
    state: NodeState,
    deadline_mono: float,
    now_mono: float,
    decision: ProtectionDecision,
) -> str | None:
    """Why ``cmd`` must be rejected, or ``None`` when it may run now.

    Args:
        cmd: the delivered command.
        host_id / node_id: this node's stable host id and control record id.
        state: durable node state (highest term, accepted controller id, generation, receipts).
        deadline_mono: authority deadline from :func:`authority_deadline`.
        now_mono: node monotonic time now.
        decision: the current local protection decision.

    Returns:
        A one-line rejection reason, or ``None``.
    """
    if cmd.node_id not in (host_id, node_id):
        return f"command is for {cmd.node_id}, this node is {host_id}"
    if not cmd.executable:
        return "recommendation only (not executable)"
    if cmd.controller_term < state.highest_term:
        return (
            f"controller term {cmd.controller_term} is below the highest seen {state.highest_term}"
        )
    if (
        cmd.controller_term == state.highest_term
        and state.term_controller_id
        and cmd.controller_id != state.term_controller_id
    ):
        return (
            f"term {cmd.controller_term} already belongs to controller "
            f"{state.term_controller_id!r}, not {cmd.controller_id!r}"
        )
    if now_mono >= deadline_mono:
        return "controller authority expired before the command could start"
    gen = parse_generation(cmd.plan_generation)
    if gen is None:
        return f"plan_generation {cmd.plan_generation!r} is malformed"
    if state.latest_generation and cmd.controller_term == state.highest_term:
        latest = parse_generation(state.latest_generation)
        if latest is not None and latest[0] == gen[0] and gen[1] < latest[1]:
            return f"plan generation {gen[1]} is older than {latest[1]}"
    for dep in cmd.dependencies:
        r = state.receipt(dep)
        if r is None or r.ack.status != "succeeded":
            status = "unknown" if r is None else r.ack.status
            return f"dependency {dep} has not succeeded ({status})"
    if cmd.kind in CONSTRUCTIVE and not decision.admits_new_work:
        return f"local protection: host is {decision.state} ({decision.reason})"
    if cmd.kind == "drain":
        return stale_drain(cmd.model_id, state)
    return None


def stale_drain(model_id: str, state: NodeState) -> str | None:
    """Why a drain of ``model_id`` names a residency that is not serving here, or ``None``.

    A destructive command is decided on the controller's last view of this host. When the
    engine it names has since died, failed or been replaced by a fresh start (a command
    carried by a slow response, or redelivered by a controller instance that lost track),
    running it would act on a residency the controller never saw, so the node refuses it
    and says why; a failed engine is cleaned up by an unload instead. This is the node's own
    copy of the controller's final destructive check (specification, "Local wire contract":
    a drain is revalidated against fresh facts before it may run), made with the freshest
    facts there are: the node's own.
    """
    child = state.children.get(model_id)
    if child is None:
        return f"drain of {model_id} refused: no {model_id} engine runs on this host"
    if child.state in DRAINABLE_CHILD_STATES:
        return None
    why = f" ({child.failure})" if child.state == "failed" and child.failure else ""
    fix = "unload it instead" if child.state == "failed" else "it is not serving yet"
    return f"drain of {model_id} refused: its engine is {child.state}{why}; {fix}"


def remember_authority(cmd: Command, state: NodeState) -> None:
    """Record the term, controller id and generation of an admitted command (persist after)."""
    if cmd.controller_term > state.highest_term:
        state.highest_term = cmd.controller_term
        state.term_controller_id = cmd.controller_id
        state.latest_generation = cmd.plan_generation
        return
    if not state.term_controller_id:
        state.term_controller_id = cmd.controller_id
    latest = parse_generation(state.latest_generation or "")
    gen = parse_generation(cmd.plan_generation)
    if latest is None or (gen is not None and (gen[0] != latest[0] or gen[1] >= latest[1])):
        state.latest_generation = cmd.plan_generation
