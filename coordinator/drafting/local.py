"""Drafting on the coordinator's own machine, with a draft model loaded here."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.drafting.base import Outcome
from specwire.drafting.drafter import DraftBlock, Drafter
from specwire.drafting.prefix_cache import PrefixCache
from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError
from specwire.logits.processors import Processing
from specwire.models.loading import LoadedModel


class LocalDraftSource:
    """A draft source backed by a model in this process."""

    def __init__(self, draft: LoadedModel, prefix_cache: PrefixCache | None = None) -> None:
        self.draft = draft
        self.name = f"local:{draft.spec}"
        self.prefix_cache = prefix_cache  # the draft's prompt cache across generations (serve)
        self._drafter: Drafter | None = None
        self._processing: Processing | None = None  # the next generation's (use_processing)

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        """Prefill the prompt into a fresh draft cache (from the prompt cache, when one is kept)."""
        self._drafter = Drafter(self.draft.model, params)
        self._drafter.processing = self._processing
        self._drafter.start(prompt, self.prefix_cache)

    def use_processing(self, processing: Processing | None) -> None:
        """Draft the next generation under the request's penalties and grammar (before ``start``)."""
        self._processing = processing

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Apply the last outcome, then draft ``k`` tokens."""
        if self._drafter is None:
            raise InvalidArgumentError("propose() before start()")
        if outcome is not None:
            self._drafter.apply(outcome.accepted, outcome.token, outcome.appended)
        return self._drafter.draft(k)

    def keep_context(self) -> None:
        """Keep the draft's cache at the context so far in the prompt cache (``Drafter.keep``)."""
        if self.prefix_cache is not None and self._drafter is not None:
            self._drafter.keep(self.prefix_cache)

    def close(self) -> None:
        """Drop the draft cache."""
        self._drafter = None
