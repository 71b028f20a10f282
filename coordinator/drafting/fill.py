"""Filling on the target's machine: a pre-speculating worker's drafts, finished by a local draft model.

A worker in fill mode (``PreSpeculation.fill``) answers each round at once
with the drafts it has ready for the target's verdict: all k of a branch it
drafted ahead (a hit), the first few of a branch under way (partial), or none
(a miss). This source drafts the rest of the block with the coordinator's own
copy of the draft model, so a round never waits for the worker's slower
passes: a hit costs the link and the protocol, a miss a local round plus
them. The worker drafts the rest of the block itself after answering, off
the critical path, and plans the next round's branches from it.

The block is one block wherever its drafts are made: the local part resumes
it after the worker's drafts (same prefix, same block index, the generator
past the worker's draws), so at T = 0, and when sampling, the local drafts
are the ones the worker would make, numerics permitting. Nothing here is
needed for losslessness: the target verifies every draft, and each draft
carries the q it was drawn from. Every round's Outcome spells out the
appended tokens, since the worker did not draft all of them.

The local draft model runs on the compute thread, between the target's
passes, as local SD's does: the two share the machine's GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from coordinator.drafting.base import DraftSource, Outcome, close_soon, first_drafts_arrived, offer_processing
from specwire.drafting.drafter import DraftBlock, Drafter, Drafting
from specwire.drafting.prefix_cache import PrefixCache
from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError
from specwire.logits.processors import Processing
from specwire.models.loading import LoadedModel


class FilledDraftSource:
    """A remote pre-speculating source whose short answers are finished here (module docstring)."""

    def __init__(
        self, remote: DraftSource, draft: LoadedModel, prefix_cache: PrefixCache | None = None
    ) -> None:
        self.remote = remote
        self.draft = draft
        self.prefix_cache = prefix_cache  # the local draft's prompt cache (serve's; auto's moves hand over)
        self.name = f"{remote.name}+fill:{draft.spec}"
        self.filled = 0  # drafts made here, over the session
        self._drafter: Drafter | None = None
        self._processing: Processing | None = None  # the next generation's (use_processing)
        self._last: list[int] = []
        self._round = 0

    @property
    def losses(self) -> list:
        """Workers lost on the way (the remote source's record)."""
        return list(getattr(self.remote, "losses", []))

    def use_processing(self, processing: Processing | None) -> None:
        """The next generation's penalties and grammar, for the worker's drafts and those made here."""
        offer_processing(self.remote, processing)
        self._processing = processing

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        """Open the worker's session (it prefills meanwhile), then prefill the local draft model."""
        self.filled, self._last, self._round = 0, [], 0
        self.remote.start(prompt, params, k)
        self._drafter = Drafter(self.draft.model, params)
        self._drafter.processing = self._processing
        self._drafter.start(prompt, self.prefix_cache)

    def keep_context(self) -> None:
        """Keep the local draft's cache at the context so far in the prompt cache (``Drafter.keep``)."""
        if self.prefix_cache is not None and self._drafter is not None:
            self._drafter.keep(self.prefix_cache)

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Send the verdict; take the drafts the worker has ready and draft the rest here."""
        drafter = self._drafter
        if drafter is None:
            raise InvalidArgumentError("propose() before start()")
        if outcome is not None:
            outcome = replace(outcome, appended=tuple(outcome.tokens(self._last)))
            drafter.apply(outcome.accepted, outcome.token, outcome.appended)
            self._round += 1
        block = self.remote.propose(k, outcome)
        ready = min(k, len(block.tokens))
        if ready < k:
            local = Drafting(drafter, drafter.context, k, self._round)
            local.resume(block.tokens[:ready], block.dists[:ready] if block.dists else None)
            local.advance()
            drafter.adopt(local)
            block = DraftBlock(
                tokens=local.tokens,
                dists=local.dists if not drafter.params.greedy else None,
                forward_passes=block.forward_passes + local.forward_passes,
                compute_ns=block.compute_ns + local.compute_ns,
                calls=block.calls,
                speculation=block.speculation,
                saved_ns=block.saved_ns,
                filled=k - ready,
            )
            self.filled += k - ready
        self._last = block.tokens
        return block

    def arrived(self) -> bool:
        """Whether the worker has answered the Open (a session opened ahead: ``Outcome.catch_up``)."""
        return first_drafts_arrived(self.remote)

    def close(self) -> None:
        """End the worker's session and drop the local cache."""
        self._drafter = None
        self.remote.close()

    def close_soon(self) -> None:
        """Drop the local cache; end the worker's session without waiting (``base.close_soon``)."""
        self._drafter = None
        close_soon(self.remote)

    def abort(self) -> None:
        """Drop the worker's session at once."""
        abort = getattr(self.remote, "abort", None)
        if abort is not None:
            abort()
