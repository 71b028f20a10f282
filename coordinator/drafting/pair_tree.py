"""Two workers' speculation caches at once (an experiment): each round verifies the better entry.

Both workers hold a tree session on the same context: each is sent every
verdict, spelt out (``Round.appended``), and answers with its entry under
it. The entry whose nodes promise more accepted tokens (the sum of their
chances of lying on the target's path) is verified; the worker it came from
is told so as usual, and the other is told the same tree as drafted here
(``Verifying`` with no reply nodes), so both draft for the outcomes of the
tree the target really verifies. Each round waits for both replies.

Issue 53 asks for both Macs together on the 27B profile; the planner's
Monte Carlo puts them level with the M1 Max alone (``docs/tree-verification.md``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace

from coordinator.drafting.base import Outcome
from coordinator.drafting.stream import StreamDraftSource
from coordinator.runtime import LoopPortal
from specwire.drafting.draft_block import DraftBlock
from specwire.drafting.sampling import SamplingParams
from specwire.logits.processors import Processing


class PairedTrees:
    """Two workers' tree sessions, the better entry of each round verified (module docstring)."""

    def __init__(self, portal: LoopPortal, first: StreamDraftSource, second: StreamDraftSource) -> None:
        self.portal = portal
        self.streams = (first, second)
        self.name = f"{first.name}&{second.name}"
        self.chosen = 0  # the stream whose entry the round verifies
        self.wins = [0, 0]  # rounds each worker's entry was verified
        self.losses: list = []
        self._block: DraftBlock | None = None

    def use_processing(self, processing: Processing | None) -> None:
        for stream in self.streams:
            stream.use_processing(processing)

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        self.wins = [0, 0]
        self.portal.call(self._open, list(prompt), params, k)

    async def _open(self, prompt: list[int], params: SamplingParams, k: int) -> None:
        await asyncio.gather(*(s.open_session(prompt, params, k) for s in self.streams))

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        requested = time.perf_counter_ns()
        appended = list(outcome.appended) if outcome is not None and outcome.appended else None
        blocks = self.portal.call(self._exchange, k, outcome, appended)
        if outcome is None:  # the Open's chain: the first worker's (the other's is read, not verified)
            self.chosen = 0
        else:
            self.chosen = max((0, 1), key=lambda i: (_promise(blocks[i]), -i))
        self.wins[self.chosen] += 1
        block = blocks[self.chosen]
        self._block = block
        block.calls[0] = replace(block.calls[0], requested_ns=requested, returned_ns=time.perf_counter_ns())
        return block

    async def _exchange(
        self, k: int, outcome: Outcome | None, appended: list[int] | None
    ) -> list[DraftBlock]:
        return list(await asyncio.gather(*(s.exchange(k, outcome, appended) for s in self.streams)))

    def verifying(
        self, reply_nodes: int, tokens: Sequence[int] = (), parents: Sequence[int] = (), after_ns: int = 0
    ) -> None:
        chosen, other = self.streams[self.chosen], self.streams[1 - self.chosen]
        chosen.verifying(reply_nodes, tokens, parents, after_ns)
        tree = self._block.tree if self._block is not None else None
        head_tokens = list(tree.tokens[:reply_nodes]) if tree is not None else []
        head_parents = list(tree.parents[:reply_nodes]) if tree is not None else []
        other.verifying(0, [*head_tokens, *tokens], [*head_parents, *parents], after_ns)

    def open_arrived(self) -> bool:
        return all(s.open_arrived() for s in self.streams)

    def close(self) -> None:
        for stream in self.streams:
            stream.close()

    def close_soon(self) -> None:
        for stream in self.streams:
            stream.close_soon()

    def abort(self) -> None:
        for stream in self.streams:
            stream.abort()


def _promise(block: DraftBlock) -> float:
    """The tokens an entry's nodes are expected to add (0: no tree ready)."""
    return float(sum(block.tree_probs)) if block.tree is not None else 0.0
