"""Drafting on the coordinator's own machine, with a draft model loaded here."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.drafting.base import Outcome
from specwire.drafting.drafter import DraftBlock, Drafter
from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError
from specwire.models import LoadedModel


class LocalDraftSource:
    """A draft source backed by a model in this process."""

    def __init__(self, draft: LoadedModel) -> None:
        self.draft = draft
        self.name = f"local:{draft.spec}"
        self._drafter: Drafter | None = None

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        """Prefill the prompt into a fresh draft cache."""
        self._drafter = Drafter(self.draft.model, params)
        self._drafter.start(prompt)

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Apply the last outcome, then draft ``k`` tokens."""
        if self._drafter is None:
            raise InvalidArgumentError("propose() before start()")
        if outcome is not None:
            self._drafter.apply(outcome.accepted, outcome.token, outcome.appended)
        return self._drafter.draft(k)

    def close(self) -> None:
        """Drop the draft cache."""
        self._drafter = None
