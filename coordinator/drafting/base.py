"""The draft-source interface the speculative decoding engine speaks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from specwire.drafting.drafter import DraftBlock
from specwire.drafting.sampling import SamplingParams
from specwire.logits.processors import Processing


@dataclass(frozen=True)
class Outcome:
    """The target's verdict on the previous proposal: drafts accepted, then its own token.

    ``appended`` spells out the tokens the verdict adds (the accepted drafts,
    then the token) when the drafts verified were not all the source's own.
    """

    accepted: int
    token: int
    appended: tuple[int, ...] = ()

    def tokens(self, last: Sequence[int]) -> list[int]:
        """The tokens the verdict appends, given the source's own last drafts ``last``."""
        return list(self.appended) if self.appended else [*last[: self.accepted], self.token]


class DraftSource(Protocol):
    """Proposes draft tokens for one generation at a time.

    ``start`` begins a session with the prompt; each ``propose`` first applies
    the outcome of the previous proposal (``None`` on the first call) and then
    drafts ``k`` tokens. One ``propose`` is one round: for a remote source it
    is one message each way.
    """

    name: str

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        """Begin a session: the draft side prefills the prompt; ``k`` is the first round's k."""
        ...

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Apply ``outcome`` to the draft state, then draft ``k`` tokens."""
        ...

    def close(self) -> None:
        """End the session and free its state; safe to call twice."""
        ...


def offer_processing(source: object, processing: Processing | None) -> None:
    """Tell ``source``, before its ``start``, the next generation's penalties and grammar (None: none), so
    that its drafts are chosen from logits processed as the verdict will be; a source without
    ``use_processing`` drafts unprocessed (still lossless: the verdict is the target's)."""
    use = getattr(source, "use_processing", None)
    if use is not None:
        use(processing)
