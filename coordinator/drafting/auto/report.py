"""What ``--draft auto`` reports of one generation: where it started and why, each move, and the
stretches of rounds each set-up served (``coordinator.drafting.auto``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.drafting.base import DraftSource
from coordinator.planning.setups import Setup
from specwire.drafting.draft_block import DraftBlock


@dataclass(frozen=True)
class Switch:
    """One move of the policy: when (round, seconds in, wall clock), from what, to what, and why."""

    round: int
    after_s: float
    wall_time: float
    from_setup: str
    to_setup: str
    reason: str


@dataclass
class Segment:
    """A stretch of the generation on one set-up: its source (None: AR) and the rounds it served.

    A session opened ahead (``AutoDraftSource``) keeps the drafts its worker answered the Open with
    (``opened``): they were drafted for the context it opened with, superseded by its catch-up, and never
    verified, but the worker counted them.
    """

    setup: Setup
    source: DraftSource | None
    first_round: int
    last_round: int = -1
    lost: bool = False
    opened: DraftBlock | None = None


@dataclass
class Decision:
    """Why the generation started where it did: the set-up and the two predicted next to it."""

    setup: str
    predicted: list[tuple[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """The JSON form: the set-up, and each of the three with its predicted tok/s."""
        return {"setup": self.setup, "predicted": [{"setup": s, "tok_s": t} for s, t in self.predicted]}
