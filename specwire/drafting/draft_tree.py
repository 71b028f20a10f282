"""Tree pre-speculation (T = 0): one tree of continuations, kept across rounds, expanded best first.

A worker in fill mode answers each Round with the drafts it has ready for
the verdict, and the coordinator drafts the rest. At T = 0 those drafts are
the draft model's first choices, so a worker that keeps drafting the likeliest
continuations, as deep as it can, has them ready whatever the round
boundaries turn out to be. Each node is a token after the verified prefix:

* its probability of lying on the target's path follows the geometric model
  of ``specwire.drafting.speculation``: the draft's first choice after a node
  continues it with the session's acceptance alpha; another of its top
  choices takes (1 - alpha) shared by the draft's probabilities;
* a pass expands the ``rows`` likeliest nodes whose token is known (one row
  each, ``BranchBatch``'s left-padded batch cache), at any depth, so the
  worker drafts several rounds ahead along the likeliest chain while it also
  covers the likeliest corrections;
* a Round is answered with the chain of first choices after its verdict's
  node (``ready``), or, when it asks for a tree, with the best nodes under
  that node (``ready_tree``), which the target verifies in one pass; the
  verdict then makes that node the root and the rest of the tree is dropped
  (``advance``), so drafting done for a later round is kept.

Every expanded node holds the KV cache of its path (a ``Line``, shared with
the nodes before it on that path), from which its children's rows are cut.
Memory grows with the lines, each a whole path's cache, and a line stays lazy
(a row of the batch cache of the pass that made it) until a pass reads it, so
the tree holds at most its lines' passes' batch caches; a verdict drops every
subtree it rules out at once. Drafters with recurrent layers (Qwen3.5) cannot
keep per-node states this way: a tree needs plain KV caches.

All model work runs on the worker's compute thread; ``ready`` may run on the
event loop during a pass, and reads only what a finished pass has set.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache, KVCache

from specwire.drafting.branch_batch import cache_view
from specwire.drafting.choices import top_choices
from specwire.drafting.drafter import Drafter
from specwire.drafting.sampling import SparseDistribution
from specwire.drafting.speculation import AcceptanceRate, PrespecConfig

DEFAULT_PASSES = 16  # passes a verdict may be followed by, while no Round comes


@dataclass(eq=False)
class Line:
    """A KV cache that holds one path of the tree, up to its ``tip``; it only ever grows (by a child of
    its tip), so every node along the path reads its own prefix from it."""

    layers: list[Any]
    tip: Node


@dataclass(eq=False)
class Node:
    """A token after the verified prefix, and what expanding it gave."""

    token: int
    probability: float
    parent: Node | None = None
    length: int = 0  # tokens of this node's path (verified prefix and all), once expanded
    line: Line | None = None  # holds that path, once expanded
    children: dict[int, Node] = field(default_factory=dict)
    first: int | None = None  # the draft's first choice after this node, once expanded
    compute_ns: int = 0  # the pass that expanded it


class DraftTree:
    """One session's tree: expands nodes a batched pass at a time; see the module docstring."""

    def __init__(self, drafter: Drafter, config: PrespecConfig, context_length: int) -> None:
        self.drafter = drafter
        self.context_length = context_length  # no node is drafted past the model's context
        self.config = config
        self.rate = AcceptanceRate()
        self.rows = config.batch
        self.width = config.alternatives  # a node's children: its first choice and ``fanout`` others
        self.budget = config.budget or DEFAULT_PASSES
        self.passes = 0  # since the last verdict
        self.root = Node(0, 1.0)
        self._source: tuple[list[Any], int] = ([], 0)  # a cache holding the root's path but its token
        self._frontier: list[tuple[float, int, Node]] = []
        self._order = itertools.count()

    @property
    def frontier(self) -> int:
        """Nodes whose token is known and not yet expanded (stale heap entries included)."""
        return len(self._frontier)

    def plant(self, first: Sequence[int], candidates: Sequence[SparseDistribution]) -> None:
        """Root the tree at the drafter's context, with the drafts ``first`` it just made there.

        The drafter's cache holds the context and every draft but the last;
        ``candidates[i]`` are the draft's top choices where ``first[i]`` was drafted.
        """
        context = self.drafter.context
        layers = [cache_view(layer, self.drafter.cache[0].offset) for layer in self.drafter.cache]
        self.root = Node(context[-1], 1.0)
        self._source = (layers, len(context) - 1)
        self._frontier = []
        line = Line(layers, self.root)
        node = self.root
        for i, (token, cand) in enumerate(zip(first, candidates, strict=True)):
            node = self._expand(node, line, len(context) + i, *_with_first(cand, token))

    def ready(self, appended: Sequence[int], k: int) -> tuple[list[int], int]:
        """The drafts ready after a verdict that appends ``appended`` (at most ``k`` first choices),
        and the compute (ns) of the passes that drafted them."""
        node: Node | None = self.root
        for token in appended:
            node = node.children.get(token) if node is not None else None
        drafts: list[int] = []
        spent = 0
        while node is not None and node.first is not None and len(drafts) < k:
            drafts.append(node.first)
            spent += node.compute_ns
            node = node.children.get(node.first)
        return drafts, spent

    def ready_tree(
        self, appended: Sequence[int], nodes: int, depth: int
    ) -> tuple[list[int], list[int], list[float], int]:
        """The tree ready after a verdict that appends ``appended``: at most ``nodes`` nodes, ``depth``
        deep, best first (each after its parent), as tokens, parent indices (-1: the verdict's last
        token) and each node's chance of lying on the target's path; and the compute (ns) of the
        passes that expanded them. Reads only what finished passes set (see ``_expand``)."""
        node: Node | None = self.root
        for token in appended:
            node = node.children.get(token) if node is not None else None
        tokens: list[int] = []
        parents: list[int] = []
        probs: list[float] = []
        if node is None or node.first is None or nodes <= 0 or depth <= 0:
            return tokens, parents, probs, 0
        spent = node.compute_ns
        base = node.probability
        order = itertools.count()
        heap = [(-c.probability, next(order), c, -1, 1) for c in node.children.values()]
        heapq.heapify(heap)
        while heap and len(tokens) < nodes:
            _, _, child, parent, level = heapq.heappop(heap)
            index = len(tokens)
            tokens.append(child.token)
            parents.append(parent)
            probs.append(child.probability / base)
            if child.first is not None and level < depth:  # expanded: its children are final
                spent += child.compute_ns
                for grandchild in child.children.values():
                    heapq.heappush(heap, (-grandchild.probability, next(order), grandchild, index, level + 1))
        return tokens, parents, probs, spent

    def advance(self, appended: Sequence[int]) -> None:
        """The verdict appended ``appended`` to the verified prefix: re-root there, drop the rest.

        The new root's source is the deepest state the tree holds on the new
        prefix; tokens past it (drafts the coordinator made that the tree had
        not reached) are fed in one pass.
        """
        held, length = self._source
        node = self.root
        walked = 0
        for token in appended:
            child = node.children.get(token)
            if node.line is not None:
                held, length = node.line.layers, node.length
            if child is None:
                break
            node, walked = child, walked + 1
        self.passes = 0
        old = self.root
        if walked == len(appended):
            self.root, self._source = node, (held, length)
        else:
            path = self.drafter.context
            held, length = self._feed(held, length, path[length : len(path) - 1])
            self.root, self._source = Node(path[-1], 1.0), (held, length)
        _drop(old, keep=self.root)
        self.root.parent = None
        scale, self._frontier = self.root.probability, []
        stack = [self.root]
        while stack:  # probabilities from the new root, so they never shrink towards zero
            n = stack.pop()
            n.probability /= scale
            if n.first is None:
                self._offer(n)
            stack.extend(n.children.values())

    def step(self) -> bool:
        """One pass over the likeliest known nodes; False when the budget or the tree is spent."""
        if self.passes >= self.budget:
            return False
        nodes = self._take()
        if not nodes:
            return False
        started = time.perf_counter_ns()
        sources = [self._source_of(n) for n in nodes]
        cache = [
            BatchKVCache.merge([cache_view(layers[i], length) for layers, length in sources])
            for i in range(len(self.drafter.cache))
        ]
        logits = self.drafter.batch_pass(mx.array([[n.token] for n in nodes]), cache)[:, -1, :]
        ids, probs = top_choices(logits.astype(mx.float32), self.width)
        self.drafter.settle(ids, probs)
        # Each row's cache stays lazy: the next pass that reads it computes it. Until then it holds this
        # pass's batch cache, which a dropped subtree lets go of at once (``_drop``).
        rows = [[layer.extract(i) for layer in cache] for i in range(len(nodes))]
        self.drafter.forward_passes += 1
        self.passes += 1
        ids_np, probs_np = np.array(ids).tolist(), np.array(probs, dtype=np.float64).tolist()
        spent = time.perf_counter_ns() - started
        for i, (node, (_, length)) in enumerate(zip(nodes, sources, strict=True)):
            node.compute_ns = spent
            self._expand(node, Line(rows[i], node), length + 1, ids_np[i], probs_np[i])
        return True

    def _take(self) -> list[Node]:
        taken: dict[int, Node] = {}
        while self._frontier and len(taken) < self.rows:
            node = heapq.heappop(self._frontier)[2]
            if node.first is None:
                taken[id(node)] = node
        return list(taken.values())

    def _source_of(self, node: Node) -> tuple[list[Any], int]:
        """A cache that holds ``node``'s path but its token, and that path's length."""
        parent = node.parent
        if parent is None:
            return self._source
        assert parent.line is not None
        return parent.line.layers, parent.length

    def _expand(self, node: Node, line: Line, length: int, ids: list[int], probs: list[float]) -> Node:
        """``node`` was fed: its path is in ``line`` (``length`` tokens); ``ids`` its next tokens,
        the first choice first, with their ``probs``. Returns the first choice's node."""
        parent = node.parent
        if parent is not None and parent.line is not None and parent.line.tip is parent:
            parent.line.layers, parent.line.tip = line.layers, node  # the same chain, one longer
            line = parent.line
        node.line, node.length = line, length
        alpha = self.rate.alpha
        rest = max(1e-12, 1.0 - probs[0])
        children = {ids[0]: Node(ids[0], node.probability * alpha, node)}
        for token, q in zip(ids[1:], probs[1:], strict=True):
            children[token] = Node(token, node.probability * (1 - alpha) * q / rest, node)
        node.children = children
        node.first = ids[0]  # last: a reader on another thread follows ``first`` into ``children``
        for child in children.values():
            self._offer(child)
        return children[ids[0]]

    def _offer(self, node: Node) -> None:
        parent = node.parent
        if parent is not None and parent.length + 1 >= self.context_length:
            return
        heapq.heappush(self._frontier, (-node.probability, next(self._order), node))

    def _feed(self, layers: list[Any], length: int, tokens: Sequence[int]) -> tuple[list[Any], int]:
        """A cache holding ``layers``' first ``length`` tokens, then ``tokens`` (one pass)."""
        if not tokens:
            return layers, length
        cache: list[KVCache] = [cache_view(layer, length) for layer in layers]
        self.drafter.batch_pass(mx.array([list(tokens)]), cache)
        self.drafter.settle(*[layer.state[0] for layer in cache])
        self.drafter.forward_passes += 1
        return cache, length + len(tokens)


def _drop(root: Node, keep: Node) -> None:
    """Unlink the tree under ``root`` but the subtree at ``keep``: parents, children and lines point at
    each other, and a dropped line holds a whole path's KV cache, which should go at once."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node is keep:
            continue
        stack.extend(node.children.values())
        node.children, node.parent, node.line = {}, None, None


def _with_first(cand: SparseDistribution, first: int) -> tuple[list[int], list[float]]:
    """A drafted position's candidates, ``first`` (the draft made there) at the head."""
    ranked = [(int(t), float(q)) for t, q in zip(cand.ids, cand.probs, strict=True)]
    head = [c for c in ranked if c[0] == first] or [(first, ranked[0][1] if ranked else 1.0)]
    ranked = head + [c for c in ranked if c[0] != first]
    return [t for t, _ in ranked], [q for _, q in ranked]
