"""What a draft session's compute hands its stream: a block of drafts and its timing (``Computed``), and
a fill-mode answer with the block it starts (``Ready``)."""

from __future__ import annotations

from dataclasses import dataclass

from specwire.drafting.drafter import DraftBlock, Drafting
from specwire.v1 import draft_pb2 as pb


@dataclass(frozen=True)
class Computed:
    """A block of drafts, and when its compute started and ended (worker clock, ns).

    ``outcome`` says how pre-speculation served it (a ``pb.SpeculationOutcome``)
    and ``saved_ns`` how much of its compute ran ahead, off the critical path.
    """

    block: DraftBlock
    started_ns: int
    finished_ns: int
    outcome: int = pb.SPECULATION_OFF
    saved_ns: int = 0


@dataclass(frozen=True)
class Ready:
    """A fill-mode answer: the reply, and the block (a branch, or a fresh one on a miss) it starts."""

    msg: pb.Round
    computed: Computed
    block: Drafting | None
    ready: int
