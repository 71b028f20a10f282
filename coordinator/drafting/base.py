"""The draft-source interface the speculative decoding engine speaks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from specwire.drafting.drafter import DraftBlock
from specwire.drafting.sampling import SamplingParams
from specwire.logits.processors import Processing


@dataclass(frozen=True)
class Outcome:
    """The target's verdict on the previous proposal: drafts accepted, then its own token.

    ``appended`` spells out the tokens the verdict adds (the accepted drafts,
    then the token) when the drafts verified were not all the source's own.
    ``catch_up``: a session opened ahead (``AutoDraftSource``) is given every
    token decoded since its prompt, ``appended``; they are no verdict on its drafts.
    """

    accepted: int
    token: int
    appended: tuple[int, ...] = ()
    catch_up: bool = False

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


@runtime_checkable
class CatchesUp(Protocol):
    """A source whose worker session may be opened ahead, while the target decodes without it, and then
    caught up on every token decoded since (``Outcome.catch_up``): a fill session's."""

    def arrived(self) -> bool:
        """Whether the session's first drafts are in hand (never waits)."""
        ...


def first_drafts_arrived(remote: object) -> bool:
    """Whether ``remote``'s Open has been answered (``StreamDraftSource.open_arrived``); a source in this
    process answers at once."""
    arrived = getattr(remote, "open_arrived", None)
    return bool(arrived()) if arrived is not None else True


def offer_processing(source: object, processing: Processing | None) -> None:
    """Tell ``source``, before its ``start``, the next generation's penalties and grammar (None: none), so
    that its drafts are chosen from logits processed as the verdict will be; a source without
    ``use_processing`` drafts unprocessed (still lossless: the verdict is the target's)."""
    use = getattr(source, "use_processing", None)
    if use is not None:
        use(processing)


def close_soon(source: DraftSource) -> None:
    """End ``source``'s session without waiting for its worker to end it (``StreamDraftSource.close_soon``:
    a move away from it goes on meanwhile); a source without a worker session closes at once."""
    soon = getattr(source, "close_soon", None)
    if soon is not None:
        soon()
    else:
        source.close()
