"""User personas: what each kind of user asks for, how often, and in what words.

A persona's label never reaches the controller: its requests carry bounded features and a
short text that the production request classifier turns into a workload. Some templates are
deliberately ambiguous (a marketer asking a general question), so the classifier, not the
label, decides. Operations users name the baseline model directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from grid_core.demand.features import EndpointFamily, Modality
from grid_core.scenario.catalog import BASELINE_MODEL
from grid_core.scenario.streams import stream

PROJECT_SIZE = 6
"""Users per synthetic project: a small team sharing one session key."""
TEAMS: dict[str, tuple[str, ...]] = {
    "creative": ("design", "image", "video"),
    "engineering": ("research", "coding"),
}
"""Projects whose members work in stable stages, in this order (design boards, then stills,
then the clip; research, then the code). Every other persona is a team of its own with one
stage. The production sequence learner must discover these orders from the session keys; the
scenario never tells the controller."""
STAGE_MINUTES = 10
"""Length of one work stage of a staged project (minutes)."""
PROJECT_PHASE_MINUTES = 7
"""Each project starts its stage cycle this many minutes after the previous one, so projects
of one team are not all in the same stage at once."""


def team_of(persona: str) -> tuple[str, int, int]:
    """``(team, stage index, stages in the team)`` of a persona."""
    for team, stages in TEAMS.items():
        if persona in stages:
            return team, stages.index(persona), len(stages)
    return persona, 0, 1


def stage_now(persona: str, project: int, minute: int) -> bool:
    """Whether ``project`` of the persona's team is in the persona's stage at ``minute``."""
    _, stage, stages = team_of(persona)
    if stages == 1:
        return True
    pos = (minute + project * PROJECT_PHASE_MINUTES) % (STAGE_MINUTES * stages)
    return pos // STAGE_MINUTES == stage


@dataclass(frozen=True)
class Persona:
    """One kind of user.

    Attributes:
        name: persona label (a workload name, or ``operations``).
        weight: share of the user population.
        rate_per_h: requests per user per hour at the baseline of the workday curve.
        endpoint / modality: what the requests look like on the wire.
        input_units / output_units: typical sizes (tokens, images, video seconds).
        texts: request openings the classifier scans (bounded, never stored).
        requested_model: ``auto`` for unbound work, or a model named directly.
        curve: which workload's demand curve scales this persona.
    """

    name: str
    weight: float
    rate_per_h: float
    endpoint: EndpointFamily
    modality: Modality
    input_units: int
    output_units: int
    texts: tuple[str, ...]
    requested_model: str = "auto"
    curve: str = ""


PERSONAS: tuple[Persona, ...] = (
    Persona(
        "coding",
        0.22,
        12,
        "chat",
        "text",
        800,
        250,
        (
            "fix this python function: def parse(row): raises KeyError on empty input",
            "refactor the sql query below so the join uses the index",
            "write a unit test for the tokenizer class and mock the file reader",
            "why does this stack trace point at the compiler flag",
            "summarize what this module does before the review",
        ),
    ),
    Persona(
        "research",
        0.10,
        6,
        "chat",
        "text",
        1500,
        500,
        (
            "summarize the paper and list the evidence for each claim",
            "compare these two studies and cite the methodology sections",
            "literature review on battery degradation, key findings and citations",
            "what does the research say about remote onboarding",
        ),
    ),
    Persona(
        "marketing",
        0.10,
        6,
        "chat",
        "text",
        300,
        300,
        (
            "draft three slogans for the spring campaign aimed at a young audience",
            "rewrite the brand story for the launch newsletter",
            "ad copy variants for the social campaign, keep the brand voice",
            "what time is the all hands meeting",
        ),
    ),
    Persona(
        "sales",
        0.10,
        8,
        "chat",
        "text",
        300,
        200,
        (
            "follow-up email to the prospect after the demo, mention the pricing quote",
            "summarize the deal notes from the crm and next steps in the pipeline",
            "objection handling for a customer asking about the renewal discount",
        ),
    ),
    Persona(
        "design",
        0.07,
        4,
        "image",
        "image",
        1,
        1,
        (
            "logo mockup for the new product line, flat vector style",
            "wireframe layout of the landing page with a muted palette",
            "typography study for the poster headline",
        ),
    ),
    Persona(
        "image",
        0.08,
        5,
        "image",
        "image",
        1,
        1,
        (
            "photo of a red bicycle leaning on a brick wall at sunset",
            "illustration of a lighthouse in a storm, oil painting",
            "product render of a ceramic mug on a white table",
        ),
    ),
    Persona(
        "video",
        0.04,
        0.6,
        "video",
        "video",
        1,
        6,
        (
            "a short clip of waves rolling onto a beach at dawn",
            "animate the product turning slowly on a pedestal",
        ),
    ),
    Persona("embedding", 0.04, 60, "embeddings", "embedding", 500, 0, ("index chunk",)),
    Persona(
        "general",
        0.15,
        6,
        "chat",
        "text",
        200,
        200,
        (
            "draft an agenda for tomorrow's team meeting",
            "translate this note into french for the visitors",
            "what is a polite way to decline an invitation",
        ),
    ),
    Persona(
        "operations",
        0.10,
        10,
        "chat",
        "text",
        300,
        100,
        (
            "summarize this alert and the last three log lines",
            "explain the change window for tonight",
        ),
        requested_model=BASELINE_MODEL,
        curve="general",
    ),
)
"""Weights sum to 1.0; rates are per user per hour at the curve's baseline."""


@dataclass(frozen=True)
class User:
    """One simulated user: an index, a persona and a project (session key surrogate)."""

    index: int
    persona: Persona
    project: int


def build_users(seed: int, users: int) -> tuple[User, ...]:
    """``users`` users drawn from the persona mix with the ``personas`` stream.

    Users of one team (:data:`TEAMS`; otherwise of one persona) are grouped into projects of
    :data:`PROJECT_SIZE`, in draw order.
    """
    rng = stream(seed, "personas")
    weights = [p.weight for p in PERSONAS]
    drawn = [rng.choices(PERSONAS, weights)[0] for _ in range(users)]
    counts: dict[str, int] = {}
    out: list[User] = []
    for i, persona in enumerate(drawn):
        team = team_of(persona.name)[0]
        k = counts.get(team, 0)
        counts[team] = k + 1
        out.append(User(i, persona, k // PROJECT_SIZE))
    return tuple(out)


def persona_named(name: str) -> Persona:
    """The persona called ``name``.

    Raises:
        KeyError: no such persona.
    """
    for p in PERSONAS:
        if p.name == name:
            return p
    raise KeyError(name)
