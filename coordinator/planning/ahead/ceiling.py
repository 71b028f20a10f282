"""The most pre-speculation can give on a set of machines: workers that draft a tree of continuations
ahead, as deep as their passes allow, with the target verifying one chain of drafts a round.

This is a bound on what drafting off the critical path can reach, not a model
of what is built (``planning.ahead.prespec`` models that: one round ahead). It is a
seeded Monte Carlo over rounds, so a figure is reproducible:

* the target's path: at each position the target's token is the draft's first
  choice with the pair's per-draft acceptance alpha; otherwise its j-th
  choice (j = 2..4) with the pair's agreement renormalised
  (``Outcomes.correction``), or a token beyond the fourth that no worker
  guesses. Positions are independent;
* each worker runs passes back to back, each over the ``rows`` unexpanded
  nodes of the tree most likely to lie on the target's path (best first, at
  any depth, so rounds ahead without limit); a pass costs the machine's curve
  over the positions it feeds. A node's token is known once its parent was
  expanded, or once the coordinator pushed it (the drafts it made itself);
  a pushed chain is fed as one row. Several workers share one tree, with
  no node expanded twice;
* each round the coordinator takes the chain of first choices the workers
  have expanded from the verified prefix, chooses k in 1..k_max for the most
  expected tokens per second of round, drafts what is missing on its own
  draft model (``local_s`` a draft, on the critical path), and verifies.
  The workers hear the verdict when the round ends (the window includes the
  link and the protocol).

What it leaves out favours the workers: no host time on a worker between
passes, pushes that cost nothing, perfect sharing between workers, and a
verdict that never waits for a pass in flight.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from coordinator.planning.ahead.prespec import Outcomes

GUESSED = 4  # choices a worker drafts after at a position: the pair's agreement goes to top-4


@dataclass(frozen=True)
class Worker:
    """A drafting machine as the ceiling takes it: seconds of a pass over n positions, rows a pass."""

    pass_s: Callable[[int], float]
    rows: int


@dataclass(frozen=True)
class Ceiling:
    """What the best tree speculation gave: throughput and the drafts ready per round."""

    tok_s: float
    ready: dict[int, float]  # fraction of rounds by the drafts the workers had ready
    mean_k: float


@dataclass(eq=False)
class RankNode:
    probability: float  # of lying on the target's path, given the verified prefix
    parent: RankNode | None
    depth: int = 0
    known: bool = False
    taken: bool = False  # in a worker's pass, ended or not
    expanded: bool = False  # that pass has ended
    children: dict[int, RankNode] = field(default_factory=dict)

    def child(self, rank: int, shares: list[float]) -> RankNode:
        """The node of the draft's ``rank``-th choice here; ``shares[rank]``: the target takes it."""
        node = self.children.get(rank)
        if node is None:
            node = self.children[rank] = RankNode(self.probability * shares[rank], self, self.depth + 1)
        return node


class RankTree:
    """The workers' speculation: nodes by the draft's choice rank, rooted at the verified prefix."""

    def __init__(self, outcomes: Outcomes, horizon: int | None = None, width: int = GUESSED) -> None:
        self.horizon = horizon  # the deepest node drafted, from the verified prefix (None: no limit)
        self.width = width  # choices a pass keeps of each node it expands
        self.shares = [*rank_shares(outcomes, width), 0.0]  # beyond the choices a worker drafts after
        self.root = RankNode(1.0, None, known=True)
        self._order = itertools.count()
        self._frontier: list[tuple[float, int, RankNode]] = []
        self._offer(self.root)

    def _offer(self, node: RankNode) -> None:
        if self.horizon is not None and node.depth - self.root.depth > self.horizon:
            return
        if not node.taken and (node.known or (node.parent is not None and node.parent.expanded)):
            heapq.heappush(self._frontier, (-node.probability, next(self._order), node))

    def take(self, rows: int) -> list[RankNode]:
        """The ``rows`` likeliest nodes for a pass, each with the pushed chain after it (one row)."""
        taken: list[RankNode] = []
        for _ in range(rows):
            while self._frontier and self._frontier[0][2].taken:
                heapq.heappop(self._frontier)
            if not self._frontier:
                break
            node = heapq.heappop(self._frontier)[2]
            while True:
                node.taken = True
                taken.append(node)
                first = node.children.get(1)
                if first is None or not first.known or first.taken:
                    break
                node = first
        return taken

    def expand(self, nodes: list[RankNode]) -> None:
        """A pass over ``nodes`` has ended: their next tokens are known."""
        for node in nodes:
            node.expanded = True
        for node in nodes:
            if not self._live(node):
                continue  # drafted after a verdict the target did not give
            for rank in range(1, self.width + 1):
                if self.shares[rank] > 0:
                    self._offer(node.child(rank, self.shares))

    def _live(self, node: RankNode) -> bool:
        while node.parent is not None:
            node = node.parent
        return node is self.root

    def ready(self, k_max: int) -> int:
        """Drafts ready after the verified prefix: its expanded chain of first choices."""
        node, n = self.root, 0
        while n < k_max and node.expanded:
            node, n = node.child(1, self.shares), n + 1
        return n

    def push(self, k: int, known: bool = True) -> list[RankNode]:
        """The round's k drafts; ``known``: the workers know them (the coordinator sent what it drafted)."""
        chain, node = [], self.root
        for _ in range(k):
            node = node.child(1, self.shares)
            if known and not node.known:
                node.known = True
                self._offer(node)
            chain.append(node)
        return chain

    def advance(self, node: RankNode) -> None:
        """The verdict: ``node`` (the target's token) becomes the verified prefix's end."""
        scale = node.probability
        node.parent, node.known = None, True
        if scale <= 0:  # a token no worker guessed: a fresh tree
            node.children, node.taken, node.expanded = {}, False, False
            node.probability = scale = 1.0
        stack = [node]
        self.root, self._frontier = node, []
        while stack:
            n = stack.pop()
            n.probability /= scale
            self._offer(n)
            stack.extend(n.children.values())


def ceiling(
    outcomes: Outcomes,
    workers: list[Worker],
    k_max: int,
    window_s: Callable[[int], float],
    local_s: float,
    rounds: int = 3000,
    seed: int = 0,
    one_round_ahead: bool = False,
    idle_while_filling: bool = False,
    choose_k: bool = True,
    push: bool = True,
) -> Ceiling:
    """Tree speculation by ``workers`` over ``rounds`` rounds (module docstring). ``window_s(k)``: a
    round's time from its drafts to its verdict, drafting aside (verification, link, protocol).

    Two restrictions measure what a design gives up: ``one_round_ahead`` drafts no deeper than the
    next round's verdict (k_max + 1 positions past the verified prefix), and ``idle_while_filling``
    has the workers wait, in a round they did not serve whole, until the coordinator's drafts reach them.
    Two more model the built tree (``specwire.drafting.ahead.draft_tree``): without ``choose_k`` every round
    verifies k_max drafts; without ``push`` a worker learns a draft only by expanding the node before
    it.
    """
    rng = random.Random(seed)
    tree = RankTree(outcomes, k_max + 1 if one_round_ahead else None)
    alpha = outcomes.alpha
    clocks = [0.0] * len(workers)  # when each worker's pass in flight ends
    passes: list[list[RankNode]] = [[] for _ in workers]
    now = tokens = 0.0
    ready_counts: dict[int, int] = {}
    k_total = 0

    def expected(k: int, ready: int) -> float:
        made = sum(alpha**i for i in range(k + 1))
        return made / (window_s(k) + max(0, k - ready) * local_s)

    def run_until(t: float) -> None:
        """Every pass that ends by ``t``, in time order; each worker starts its next at once."""
        while True:
            i = min(range(len(workers)), key=lambda j: clocks[j])
            if clocks[i] > t:
                return
            tree.expand(passes[i])
            passes[i] = tree.take(workers[i].rows)
            clocks[i] = clocks[i] + workers[i].pass_s(len(passes[i])) if passes[i] else t + 1e-9

    for _ in range(rounds):
        ready = tree.ready(k_max)
        k = max(range(1, k_max + 1), key=lambda kk: expected(kk, ready)) if choose_k else k_max
        ready_counts[min(ready, k)] = ready_counts.get(min(ready, k), 0) + 1
        k_total += k
        now += max(0, k - ready) * local_s
        if idle_while_filling and ready < k:
            clocks = [max(c, now) for c in clocks]
        run_until(now)
        chain = tree.push(k, push)
        now += window_s(k)
        run_until(now)
        node, accepted = tree.root, 0
        for draft in chain:
            rank = target_rank(rng, tree.shares)
            if rank != 1:
                break
            node, accepted = draft, accepted + 1
        else:
            rank = target_rank(rng, tree.shares)
        tree.advance(node.child(rank, tree.shares) if rank <= GUESSED else RankNode(0.0, node))
        tokens += accepted + 1
    return Ceiling(
        tok_s=tokens / now,
        ready={r: n / rounds for r, n in sorted(ready_counts.items())},
        mean_k=k_total / rounds,
    )


def rank_shares(outcomes: Outcomes, width: int = GUESSED) -> list[float]:
    """P(the target's token is the draft's rank-th choice), ranks 1..``width`` (index 0 unused)."""
    alpha = outcomes.alpha
    return [0.0, alpha] + [(1 - alpha) * outcomes.correction(r) for r in range(2, width + 1)]


def target_rank(rng: random.Random, shares: list[float]) -> int:
    """The target's token at one position, as the draft's choice rank among ``shares``' (ranks 1 to
    ``len(shares) - 2``, then a 0 for the rest); that count + 1: none guessed."""
    width = len(shares) - 2
    u = rng.random()
    for rank in range(1, width + 1):
        u -= shares[rank]
        if u < 0:
            return rank
    return width + 1
