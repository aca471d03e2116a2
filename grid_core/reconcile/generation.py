"""Plan generations: ``epoch:sequence:digest`` names every plan the controller made.

The epoch is a random id of one durable history, the sequence increases with every plan
across restarts (it is persisted), and the digest identifies the plan's content. Actions and
commands carry the generation they were issued under (specification, "Local wire contract":
generations).
"""

from __future__ import annotations


class Generations:
    """The controller's plan generation counter.

    Args:
        epoch: random id of this durable history.

    Attributes:
        epoch: as given (replaced by a restored one).
        sequence: last plan sequence number issued.
        current: the latest generation (empty before the first plan).
    """

    def __init__(self, epoch: str) -> None:
        self.epoch = epoch
        self.sequence = 0
        self.current = ""

    def restore(self, epoch: str, sequence: int) -> None:
        """Continue a restored history."""
        self.epoch, self.sequence = epoch, sequence

    def next(self, digest: str) -> str:
        """Name the next plan, whose content digest is ``digest`` (hex), and return it."""
        self.sequence += 1
        self.current = f"{self.epoch}:{self.sequence:020d}:{digest[:16]}"
        return self.current
