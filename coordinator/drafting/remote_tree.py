"""Remote tree verification: a worker's speculation cache, its entry for the verdict verified in one pass.

A worker in a tree session (``PreSpeculation`` tree and fill) keeps a tree of
the draft model's likeliest continuations and expands it best first while
the target verifies (``specwire.drafting.ahead.draft_tree``): a cache keyed on the
verification's outcome, since a node's chance of lying on the target's path
is also the chance that the verdict ends there (its parent accepted, it the
target's token), whatever the target verifies. Each Round here asks for the
entry under the verdict (``Round.tree_nodes``): the worker answers at once
with the nodes it has, best first, each with its chance of lying on the
target's path. The target verifies the first n of them, n chosen so that
the expected tokens of the round over the target's time for n + 1 positions
(its measured ``VerifyCurve``) is largest. As the verification starts, the
worker is told what it verifies (``Verifying``: its nodes and any drafted
here, and when), so it times its passes to end by the verdict.

When the worker has nothing ready under the verdict, the round verifies the
verdict's token alone (``miss`` "ar"), which a worker that makes two passes
in such a round, after the one the verdict comes in the middle of, turns
into an entry for the next verdict; a slower worker
has a tree drafted here instead ("tree": ``LocalTreeDraftSource``, which sees
every verdict, so its context stays the target's; a session whose misses
verify the lone token starts it only if it ever drafts here). ``planning.ahead.tree_verify``
says which.

At every temperature the target verifies a tree by its own draws: a node
is taken where the target's draw is its token, so the output is distributed
as the target's whatever the tree holds (at T > 0 the worker ranks nodes by
its distribution at that temperature). The first round's chain is the
worker's, drafted on demand with its distributions, and verified by
rejection sampling.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from coordinator.drafting.base import DraftSource, Outcome, close_soon, first_drafts_arrived, offer_processing
from coordinator.drafting.local_tree import LocalTreeDraftSource, VerifyCurve
from specwire.drafting.draft_block import DraftBlock
from specwire.drafting.prefix_cache import PrefixCache
from specwire.drafting.sampling import SamplingParams
from specwire.drafting.token_tree import TokenTree
from specwire.logits.processors import Processing
from specwire.models.loading import LoadedModel

FIRST_K = 2  # the first round's chain, drafted by the worker on demand while it prefills the tree


class RemoteTreeDraftSource:
    """A worker's trees, sized to the target's curve, and a local tree when it has none (module docstring)."""

    def __init__(
        self,
        remote: DraftSource,
        draft: LoadedModel,
        curve: VerifyCurve,
        miss: str = "tree",
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.remote = remote
        self.curve = curve
        self.miss = (
            miss  # a round the worker has nothing for: "ar", the verdict's token alone; "tree", a local tree
        )
        self.local = LocalTreeDraftSource(draft, curve, prefix_cache=prefix_cache)
        self.name = f"{remote.name}+tree-verify+local-tree:{draft.spec}"
        self.filled = 0  # rounds the local draft model drafted, the worker having nothing ready
        self.trimmed = 0  # nodes the worker sent that did not pay to verify
        self._last: list[int] = []  # the drafts of a chain round (the first), whose verdict names none
        # Where a miss verifies the verdict's token alone, the local draft starts only at the first round it
        # drafts (never, unless the miss shape changes): until then only the context is kept. Prefilling it
        # at the session's start stalled a round of auto's by 9 ms on the paper's test bed, for a draft
        # such a session never uses. Where a miss drafts a tree here, it starts with the session.
        self._context: list[int] = []
        self._start: tuple[SamplingParams, int] | None = None  # the local draft's start, while deferred

    @property
    def local_started(self) -> bool:
        """Whether the local draft has started (at the first round it drafted a tree here)."""
        return self._start is None

    @property
    def losses(self) -> list:
        """Workers lost on the way (the remote source's record)."""
        return list(getattr(self.remote, "losses", []))

    def use_processing(self, processing: Processing | None) -> None:
        """The next generation's penalties and grammar, for the worker's trees and the local ones."""
        offer_processing(self.remote, processing)
        self.local.use_processing(processing)

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        """Open the worker's session (it prefills meanwhile); then prefill the local draft model, or, where
        a miss verifies the verdict's token alone, leave it until it is first needed."""
        self.filled = self.trimmed = 0
        self._last = []
        self.remote.start(prompt, params, min(k, FIRST_K))
        self.local.close()
        self._context, self._start = list(prompt), (params, k)
        if self.miss == "tree":  # it drafts here at every miss: started now, not mid-round
            self._start_local()

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Send the verdict; verify the worker's tree, or one drafted here if it has none ready."""
        if outcome is None:  # the Open's answer: a short chain the worker drafted on demand
            block = self.remote.propose(min(k, FIRST_K), None)
            self._last = list(block.tokens)
            return block
        # spelt out: the worker and the local tree each drafted some of the rounds
        outcome = replace(outcome, appended=tuple(outcome.tokens(self._last)))
        if self._start is None:
            self.local.observe(outcome)
        else:
            self._context.extend(outcome.appended)
        self._last = []
        block = self.remote.propose(k, outcome)
        came = time.perf_counter_ns()
        if block.tree is not None:
            sized = self._sized(block)
            self._verifying(len(sized.tokens), came)
            return sized
        self.filled += 1
        local = DraftBlock([], None, 0, 0) if self.miss == "ar" else self._local_tree(k)
        tree = local.tree
        self._verifying(0, came, tree.tokens if tree else (), tree.parents if tree else ())
        return replace(local, calls=block.calls, speculation=block.speculation, filled=len(local.tokens))

    def _local_tree(self, k: int) -> DraftBlock:
        """A tree drafted here, the local draft started on the context so far if it has not been."""
        self._start_local()
        return self.local.draft_tree(k)

    def _start_local(self) -> None:
        if self._start is not None:
            params, k = self._start
            self._start = None
            self.local.start(self._context, params, k)

    def _verifying(
        self, reply_nodes: int, came_ns: int, tokens: Sequence[int] = (), parents: Sequence[int] = ()
    ) -> None:
        """Tell the worker what the target verifies now, its reply having come at ``came_ns`` (a source
        without the message is not told)."""
        tell = getattr(self.remote, "verifying", None)
        if tell is not None:
            tell(reply_nodes, tokens, parents, time.perf_counter_ns() - came_ns)

    def _sized(self, block: DraftBlock) -> DraftBlock:
        """The tree's first n nodes (a tree too: each node comes after its parent), n from the curve."""
        tree = block.tree
        assert tree is not None
        if len(block.tree_probs) != len(tree):
            return block
        n = self.curve.best_size(block.tree_probs)
        if n == len(tree):
            return block
        self.trimmed += len(tree) - n
        sized = TokenTree(tree.tokens[:n], tree.parents[:n])
        return replace(
            block,
            tokens=list(sized.tokens),
            tree=sized,
            tree_probs=block.tree_probs[:n],
            trimmed=len(tree) - n,
        )

    def keep_context(self) -> None:
        """Keep the local draft's cache at the context so far in the prompt cache (its local tree's), if
        it has started."""
        if self._start is None:
            self.local.keep_context()

    def arrived(self) -> bool:
        """Whether the worker has answered the Open (a session opened ahead: ``Outcome.catch_up``)."""
        return first_drafts_arrived(self.remote)

    def close(self) -> None:
        """End the worker's session and drop the local caches."""
        self.local.close()
        self.remote.close()

    def close_soon(self) -> None:
        """Drop the local caches; end the worker's session without waiting (``base.close_soon``)."""
        self.local.close()
        close_soon(self.remote)

    def abort(self) -> None:
        """Drop the worker's session at once."""
        abort = getattr(self.remote, "abort", None)
        if abort is not None:
            abort()
