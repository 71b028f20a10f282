"""Pre-speculation: drafting the next round for the target's likely verdicts while it verifies.

After a round's k drafts d_1..d_k go out, the target will answer with one of
these outcomes: a drafts accepted (0 <= a <= k), then its own token t (a
correction when a < k, the bonus when a = k). The speculator ranks outcomes
by an estimated probability and drafts the next block after the most likely
ones, one forward pass at a time, until the real verdict arrives:

* P(a) follows the geometric model of the paper's TPS formula: a per-token
  acceptance rate alpha (estimated from this session's verdicts) gives
  P(a) = alpha^a (1 - alpha) for a < k and alpha^k for a = k.
* P(t | a) is the draft's own distribution at that position: q_{a+1}
  without d_{a+1} for a correction, and q_{k+1} (one extra pass, the
  "bonus probe") for the bonus. The top ``fanout`` tokens are candidates.
* The budget (forward passes per round) goes to outcomes in order of
  probability.

Branches are keyed by (accepted, token) and each remembers the full prefix
it was drafted after; ``find`` serves a branch only when that prefix is the
real one. A branch is an ordinary ``Drafting`` of the next block index, so
its drafts (and, when sampling, their randomness) are exactly the ones that
drafting on demand would give.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from specwire.drafting.ahead.branch_batch import BranchBatch, batchable
from specwire.drafting.ahead.prespec_config import PrespecConfig
from specwire.drafting.drafter import Drafter, Drafting

PRIOR_ACCEPTED = 4.0  # the acceptance estimate starts at 4 / (4 + 1) = 0.8
PRIOR_REJECTIONS = 1.0


@dataclass
class AcceptanceRate:
    """A session's per-draft acceptance rate (geometric model), learnt from its verdicts."""

    accepted: float = PRIOR_ACCEPTED
    rejections: float = PRIOR_REJECTIONS

    @property
    def alpha(self) -> float:
        """The estimate: accepted drafts over drafts judged up to the first rejection."""
        return self.accepted / (self.accepted + self.rejections)

    def observe(self, accepted: int, drafted: int) -> None:
        """Learn from one verdict: ``accepted`` of ``drafted`` drafts."""
        self.accepted += accepted
        self.rejections += accepted < drafted


@dataclass
class Branch:
    """The next block, drafted for one guessed outcome."""

    accepted: int
    token: int
    probability: float
    block: Drafting | None = None


class Speculator:
    """Pre-speculation for one session's drafter; every method that runs the model is compute-thread only."""

    def __init__(self, drafter: Drafter, config: PrespecConfig) -> None:
        self.drafter = drafter
        self.config = config
        self.rate = AcceptanceRate()
        self.branches: dict[tuple[int, int], Branch] = {}
        self.passes = 0  # speculative passes since the last plan
        self._queue: list[tuple[float, int, Branch | None]] = []
        self._order = itertools.count()
        self._base: list[int] = []
        self._drafts: list[int] = []
        self._index = 0
        self._budget = 0
        self._k = 0
        self._batch: BranchBatch | None = None
        self._probe: Drafting | None = None

    def plan(self, sent: Drafting) -> None:
        """Rank the outcomes of ``sent``, the block just adopted and sent; forgets earlier branches."""
        self.branches = {}
        self._queue = []
        self.passes = 0
        self._batch = None
        self._probe = None
        self._base = list(sent.prefix)
        self._k = len(self.drafter.last_drafts)
        self._drafts = list(self.drafter.last_drafts)
        self._index = self.drafter.blocks
        self._budget = self.config.passes(self._k)
        alpha = self.rate.alpha
        for a in range(self._k):
            p_a = alpha**a * (1.0 - alpha)
            if a < len(sent.candidates):
                cand = sent.candidates[a]
                drafted = self._drafts[a]
                rest = max(1e-12, 1.0 - cand.prob(drafted))
                picks = [
                    (int(t), float(q)) for t, q in zip(cand.ids, cand.probs, strict=True) if t != drafted
                ]
                for t, q in picks[: self.config.fanout]:
                    self._push(p_a * q / rest, Branch(a, t, p_a * q / rest))
        self._push(alpha**self._k, None)  # the bonus probe: q_{k+1} after all k drafts

    def _push(self, probability: float, branch: Branch | None) -> None:
        heapq.heappush(self._queue, (-probability, next(self._order), branch))

    def step(self) -> bool:
        """Run one speculative forward pass; False when the budget or the plan is spent."""
        if self.config.batch > 1 and self.drafter.processing is None and batchable(self.drafter.cache):
            return self._batched_step()
        if self.passes >= self._budget or not self._queue:
            return False
        probability, _, branch = self._queue[0]
        if branch is None:  # the bonus probe
            heapq.heappop(self._queue)
            dist = self.drafter.distribution_after(self._base + self._drafts, self.config.fanout)
            for t, q in zip(dist.ids, dist.probs, strict=True):
                p = -probability * float(q)
                self._push(p, Branch(self._k, int(t), p))
        else:
            if branch.block is None:
                branch.block = self._start(branch)
            branch.block.advance(1)
            if branch.block.done:
                heapq.heappop(self._queue)
        self.passes += 1
        return True

    def _batched_step(self) -> bool:
        """One pass over the most likely branches side by side (``specwire.drafting.ahead.branch_batch``)."""
        if self.passes >= self._budget or not self._queue:
            return False
        if self._batch is None:
            self._batch = BranchBatch(self.drafter)
        batch = self._batch
        room = self.config.batch - len(batch.rows)
        trunk: list[Drafting] = []
        bonus: list[Drafting] = []
        for _, _, branch in sorted(self._queue):
            if room <= 0:
                break
            if branch is None:
                if self._probe is None:
                    self._probe = Drafting(
                        self.drafter, self._base + self._drafts, 1, self._index, self.config.fanout
                    )
                    trunk.append(self._probe)
                    room -= 1
            elif branch.block is None:
                branch.block = self._start(branch)
                (bonus if branch.accepted == self._k else trunk).append(branch.block)
                room -= 1
        if trunk:
            held = self._base + self._drafts[:-1]
            batch.add(trunk, self.drafter.hold(held), held)
        if bonus:
            held = self._base + self._drafts
            probed = self.drafter.hold(held) if self._probe is None else batch.finished[id(self._probe)]
            batch.add(bonus, probed, held)
        for block in trunk + bonus:
            block.batch = batch
        finished = {id(block) for block in batch.step()}
        self.passes += 1
        if self._probe is not None and id(self._probe) in finished:
            probability = next(-p for p, _, b in self._queue if b is None)
            cand, size = self._probe.candidates[0], self.config.fanout
            for t, q in zip(cand.ids[:size], cand.probs[:size], strict=True):
                self._push(probability * float(q), Branch(self._k, int(t), probability * float(q)))
        self._queue = [
            (p, o, b)
            for p, o, b in self._queue
            if not (b is None and self._probe is not None and self._probe.done)
            and not (b is not None and b.block is not None and id(b.block) in finished)
        ]
        heapq.heapify(self._queue)
        return True

    def _start(self, branch: Branch) -> Drafting:
        prefix = self._base + self._drafts[: branch.accepted] + [branch.token]
        block = Drafting(self.drafter, prefix, self._k, self._index, self.config.alternatives)
        self.branches[(branch.accepted, branch.token)] = branch
        return block

    def find(self, accepted: int, token: int, appended: list[int] | None = None) -> Drafting | None:
        """The branch drafted for this verdict, if any, and only if its prefix is the real one.

        Call before the verdict is applied; ``appended`` as for ``Drafter.apply``.
        """
        branch = self.branches.get((accepted, token))
        if branch is None or branch.block is None:
            return None
        real = self.drafter.context + self.drafter.verdict_tokens(accepted, token, appended)
        return branch.block if branch.block.prefix == real else None
