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
subtree it rules out at once.

A draft model with recurrent layers (Qwen3.5's Gated DeltaNet, kept in
mlx-lm's ``ArraysCache``) has no positions to cut a prefix from: each
expanded node also keeps its recurrent layers' state after its own path
(``Node.states``), and a pass gathers its rows' parents' states as the rows of
one batch ``ArraysCache``. A node's state is a whole layer's state (about
1 MiB a layer for Qwen3.5-0.8B), so a worker's trees share a bound on the
bytes their nodes hold (``TreeMemory``, the worker's ``--tree-memory``;
each node is charged its KV row and its recurrent states): a tree that
reaches it stops expanding until a verdict drops what it rules out.

All model work runs on the worker's compute thread; ``ready`` may run on the
event loop during a pass, and reads only what a finished pass has set.
"""

from __future__ import annotations

import heapq
import itertools
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache

from specwire.drafting.branch_batch import cache_view
from specwire.drafting.choices import top_choices
from specwire.drafting.drafter import Drafter
from specwire.drafting.sampling import SparseDistribution
from specwire.drafting.speculation import AcceptanceRate, PrespecConfig

DEFAULT_PASSES = 16  # passes a verdict may be followed by, while no Round comes

States = dict[int, list[mx.array]]  # recurrent layers' ArraysCache contents after a path, by layer


def tree_batchable(cache: Sequence[Any]) -> bool:
    """True when a tree can branch every layer of a prompt cache: plain KV caches and recurrent
    ``ArraysCache`` layers (whose state each node keeps)."""
    return all(type(layer) in (KVCache, ArraysCache) for layer in cache)


@dataclass(eq=False)
class Line:
    """A KV cache that holds one path of the tree, up to its ``tip``; it only ever grows (by a child of
    its tip), so every node along the path reads its own prefix from it."""

    layers: list[Any]  # by layer; None for a recurrent layer (its state is each node's own)
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
    bytes: int = 0  # what expanding it holds: its KV row and recurrent states (``TreeMemory``)
    states: States | None = None  # recurrent layers only: their state after this node, once expanded


class TreeMemory:
    """The bytes that one worker's trees may hold together (``limit`` 0: no limit): each expanded node's
    KV row (its path's cache, cut from its pass's batch) and recurrent states."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self._trees: weakref.WeakSet[DraftTree] = weakref.WeakSet()  # a closed session's tree goes with it

    def join(self, tree: DraftTree) -> None:
        """Count ``tree``'s states from now on."""
        self._trees.add(tree)

    @property
    def used(self) -> int:
        """Bytes the trees hold now."""
        return sum(tree.held_bytes for tree in self._trees)

    def free(self) -> int | None:
        """Bytes the trees may still take (None: no limit)."""
        return max(0, self.limit - self.used) if self.limit else None


class DraftTree:
    """One session's tree: expands nodes a batched pass at a time; see the module docstring."""

    def __init__(
        self,
        drafter: Drafter,
        config: PrespecConfig,
        context_length: int,
        memory: TreeMemory | None = None,
    ) -> None:
        self.drafter = drafter
        self.context_length = context_length  # no node is drafted past the model's context
        self.config = config
        self.rate = AcceptanceRate()
        self.rows = config.batch
        self.width = config.alternatives  # a node's children: its first choice and ``fanout`` others
        self.budget = config.budget or DEFAULT_PASSES
        self.passes = 0  # since the last verdict
        self.root = Node(0, 1.0)
        # A cache holding the root's path but its token, that path's length, and (recurrent layers) their
        # state after it.
        self._source: tuple[list[Any], int, States] = ([], 0, {})
        self._frontier: list[tuple[float, int, Node]] = []
        self._order = itertools.count()
        self.recurrent = [i for i, layer in enumerate(drafter.cache) if isinstance(layer, ArraysCache)]
        self.held = 0  # expanded nodes holding memory of their own
        self.held_bytes = 0  # ... and what they hold
        self.state_bytes = 0  # one node's recurrent states
        self._kv_bytes_a_position = 0  # one position of a KV row, every layer
        self.memory = memory or TreeMemory()
        self.memory.join(self)

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
        # The drafter's cache holds the context and every draft but the last (all of it: no KV layer).
        kv_layers = [layer for layer in self.drafter.cache if isinstance(layer, KVCache)]
        held = kv_layers[0].offset if kv_layers else len(context) + len(first) - 1
        layers = [
            None if i in self.recurrent else cache_view(layer, held)
            for i, layer in enumerate(self.drafter.cache)
        ]
        kv: list[Any] = [a for layer in layers if layer is not None for a in (layer.keys, layer.values)]
        self._kv_bytes_a_position = sum(a.nbytes // (a.shape[0] * a.shape[2]) for a in kv)
        self.root = Node(context[-1], 1.0)
        self._source = (layers, len(context) - 1, {})
        self._frontier = []
        self.held = self.held_bytes = 0
        line = Line(layers, self.root)
        node = self.root
        for i, (token, cand) in enumerate(zip(first, candidates, strict=True)):
            states = self._kept_states(len(context) + i)
            if states is not None:
                self.state_bytes = sum(a.nbytes for arrays in states.values() for a in arrays)
            # The line is the drafter's own cache: a planted node is charged its states alone.
            charged = self._cost(0) if states is not None else 0
            node = self._expand(node, line, len(context) + i, *_with_first(cand, token), states, charged)

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
        held, length, states = self._source
        node = self.root
        walked = 0
        for token in appended:
            child = node.children.get(token)
            if node.line is not None:
                held, length, states = node.line.layers, node.length, node.states or {}
            if child is None:
                break
            node, walked = child, walked + 1
        self.passes = 0
        old = self.root
        if walked == len(appended):
            self.root, self._source = node, (held, length, states)
        else:
            path = self.drafter.context
            self._source = self._feed(held, length, states, path[length : len(path) - 1])
            self.root = Node(path[-1], 1.0)
        _drop(old, keep=self.root)
        self.root.parent = None
        scale, self._frontier, self.held, self.held_bytes = self.root.probability, [], 0, 0
        stack = [self.root]
        while stack:  # probabilities from the new root, so they never shrink towards zero
            n = stack.pop()
            n.probability /= scale
            self.held += n.bytes > 0
            self.held_bytes += n.bytes
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
        cache: list[Any] = []
        for i in range(len(self.drafter.cache)):
            if i in self.recurrent:  # each row from its own parent's state
                cache.append(_batch_states([source[2][i] for source in sources]))
            else:
                cache.append(BatchKVCache.merge([cache_view(s[0][i], s[1]) for s in sources]))
        logits = self.drafter.batch_pass(mx.array([[n.token] for n in nodes]), cache)[:, -1, :]
        ids, probs = top_choices(logits.astype(mx.float32), self.width)
        self.drafter.settle(ids, probs)
        # Each row's cache stays lazy: the next pass that reads it computes it. Until then it holds this
        # pass's batch cache, which a dropped subtree lets go of at once (``_drop``).
        rows = [
            [None if j in self.recurrent else layer.extract(i) for j, layer in enumerate(cache)]
            for i in range(len(nodes))
        ]
        states = [
            {j: [a[i : i + 1] for a in cache[j].cache] for j in self.recurrent} for i in range(len(nodes))
        ]
        self.drafter.forward_passes += 1
        self.passes += 1
        ids_np, probs_np = np.array(ids).tolist(), np.array(probs, dtype=np.float64).tolist()
        spent = time.perf_counter_ns() - started
        for i, (node, source) in enumerate(zip(nodes, sources, strict=True)):
            node.compute_ns = spent
            line = Line(rows[i], node)
            recurrent = states[i] if self.recurrent else None
            length = source[1] + 1
            self._expand(node, line, length, ids_np[i], probs_np[i], recurrent, self._cost(length))
        return True

    def _take(self) -> list[Node]:
        """The likeliest unexpanded nodes, at most ``rows``, and no more than the memory bound leaves room
        for (each costs its path's KV row and a recurrent state)."""
        free = self.memory.free()
        taken: dict[int, Node] = {}
        while self._frontier and len(taken) < self.rows:
            entry = heapq.heappop(self._frontier)
            node = entry[2]
            if node.first is not None or id(node) in taken:
                continue
            if free is not None:
                cost = self._cost(self._source_of(node)[1] + 1)
                if cost > free:
                    heapq.heappush(self._frontier, entry)
                    break
                free -= cost
            taken[id(node)] = node
        return list(taken.values())

    def _source_of(self, node: Node) -> tuple[list[Any], int, States]:
        """A cache that holds ``node``'s path but its token, that path's length, and the recurrent
        layers' state after it."""
        parent = node.parent
        if parent is None:
            return self._source
        assert parent.line is not None
        return parent.line.layers, parent.length, parent.states or {}

    def _cost(self, length: int) -> int:
        """What a node holds once expanded: its recurrent states, and a KV row of ``length`` positions."""
        return self.state_bytes + self._kv_bytes_a_position * length

    def _kept_states(self, position: int) -> States | None:
        """The drafter's recurrent states after its first ``position`` tokens (kept after each pass)."""
        if not self.recurrent:
            return None
        kept = self.drafter.checkpoints.kept.get(position)
        if kept is None:
            raise RuntimeError(f"the drafter kept no recurrent state at position {position}")
        return {i: list(kept[i][0]) for i in self.recurrent}

    def _expand(
        self,
        node: Node,
        line: Line,
        length: int,
        ids: list[int],
        probs: list[float],
        states: States | None = None,
        charged: int = 0,
    ) -> Node:
        """``node`` was fed: its path is in ``line`` (``length`` tokens; recurrent layers: ``states``),
        and it holds ``charged`` bytes of its own (``TreeMemory``); ``ids`` its next tokens, the first
        choice first, with their ``probs``. Returns the first choice's node."""
        parent = node.parent
        if parent is not None and parent.line is not None and parent.line.tip is parent:
            parent.line.layers, parent.line.tip = line.layers, node  # the same chain, one longer
            line = parent.line
        node.line, node.length, node.states = line, length, states
        node.bytes = charged
        if charged:
            self.held, self.held_bytes = self.held + 1, self.held_bytes + charged
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

    def _feed(
        self, layers: list[Any], length: int, states: States, tokens: Sequence[int]
    ) -> tuple[list[Any], int, States]:
        """A cache holding ``layers``' first ``length`` tokens (recurrent layers: ``states``), then
        ``tokens`` (one pass)."""
        if not tokens:
            return layers, length, states
        cache: list[Any] = []
        for i, layer in enumerate(layers):
            if i in self.recurrent:
                cache.append(_batch_states([states[i]]))
            else:
                cache.append(cache_view(layer, length))
        self.drafter.batch_pass(mx.array([list(tokens)]), cache)
        fed: list[Any] = [
            a for layer in cache for a in (layer.cache if isinstance(layer, ArraysCache) else layer.state)
        ]
        self.drafter.settle(*fed)
        self.drafter.forward_passes += 1
        return (
            [None if i in self.recurrent else layer for i, layer in enumerate(cache)],
            length + len(tokens),
            {i: list(cache[i].cache) for i in self.recurrent},
        )


def _batch_states(rows: Sequence[list[mx.array]]) -> ArraysCache:
    """A recurrent layer's batch cache whose row i starts from ``rows[i]`` (one path's state each)."""
    layer = ArraysCache(len(rows[0]))
    for j in range(len(rows[0])):
        parts = [row[j] for row in rows]
        layer[j] = parts[0] if len(parts) == 1 else mx.concatenate(parts)
    return layer


def _drop(root: Node, keep: Node) -> None:
    """Unlink the tree under ``root`` but the subtree at ``keep``: parents, children and lines point at
    each other, and a dropped line holds a whole path's KV cache, which should go at once."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node is keep:
            continue
        stack.extend(node.children.values())
        node.children, node.parent, node.line, node.states, node.bytes = {}, None, None, None, 0


def _with_first(cand: SparseDistribution, first: int) -> tuple[list[int], list[float]]:
    """A drafted position's candidates, ``first`` (the draft made there) at the head."""
    ranked = [(int(t), float(q)) for t, q in zip(cand.ids, cand.probs, strict=True)]
    head = [c for c in ranked if c[0] == first] or [(first, ranked[0][1] if ranked else 1.0)]
    ranked = head + [c for c in ranked if c[0] != first]
    return [t for t, _ in ranked], [q for _, q in ranked]
