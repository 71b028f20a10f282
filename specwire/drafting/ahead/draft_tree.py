"""Tree pre-speculation (T = 0): one tree of continuations, kept across rounds, expanded best first.

A worker in fill mode answers each Round with the drafts it has ready for
the verdict, and the coordinator drafts the rest. At T = 0 those drafts are
the draft model's first choices, so a worker that keeps drafting the likeliest
continuations, as deep as it can, has them ready whatever the round
boundaries turn out to be. Each node is a token after the verified prefix:

* its probability of lying on the target's path follows the geometric model
  of ``specwire.drafting.ahead.speculation``: the draft's first choice after a node
  continues it with the session's acceptance alpha; another of its top
  choices takes (1 - alpha) shared by the draft's probabilities;
* a pass expands the ``rows`` likeliest nodes whose token is known, at any
  depth, in one forward pass (each node sees the prefix and its own
  ancestors: tree attention), so the worker drafts several rounds ahead
  along the likeliest chain while it also covers the likeliest corrections;
* a Round is answered with the chain of first choices after its verdict's
  node (``ready``), or, when it asks for a tree, with the best nodes under
  that node (``ready_tree``), which the target verifies in one pass; the
  verdict then makes that node the root and the rest of the tree is dropped
  (``advance``), so drafting done for a later round is kept.

The nodes are arrays (``specwire.drafting.ahead.tree_table``); what an expanded
node computed, its K/V and (Qwen3.5's Gated DeltaNet layers) its recurrent
state, is one slot of the arena (``specwire.drafting.ahead.tree_arena``). A pass's
choices and bookkeeping run inside its paced time (its mask is built just
before), as a Mac's host work overlaps its GPU's, and its nodes are
published, for ``ready`` to find, only once the pass is held: no draft is
ready before the emulated Mac would have it. A worker's trees share a bound on the
bytes their slots hold (``TreeMemory``, the worker's ``--tree-memory``: each
slot is charged its KV position and recurrent states): a tree that reaches
it stops expanding until a verdict drops what it rules out.

All model work runs on the worker's compute thread; ``ready`` and
``ready_tree`` may run on the event loop during a pass, and read the node
table under its lock.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache

from specwire.drafting.ahead.branch_batch import cache_view
from specwire.drafting.ahead.prespec_config import PrespecConfig
from specwire.drafting.ahead.speculation import AcceptanceRate
from specwire.drafting.ahead.tree_arena import NONE, TreeArena
from specwire.drafting.ahead.tree_table import NodeTable
from specwire.drafting.choices import processed_choices, top_choices_now
from specwire.drafting.drafter import Drafter
from specwire.drafting.sampling import SparseDistribution
from specwire.emulation.pace import hold_pass
from specwire.emulation.profile import measured_pass_s, non_decreasing
from specwire.models.node_pass import LayerRows, forward_nodes_keeping_states
from specwire.models.tree_pass import placed

DEFAULT_PASSES = 16  # passes a verdict may be followed by, while no Round comes
PASS_TIMES = 8  # recent passes whose median time beyond the curve predicts the next one's


def tree_batchable(cache: Sequence[Any]) -> bool:
    """True when a tree can branch every layer of a prompt cache: plain KV caches and recurrent
    ``ArraysCache`` layers (whose state each node keeps)."""
    return all(type(layer) in (KVCache, ArraysCache) for layer in cache)


class TreeMemory:
    """The bytes that one worker's trees may hold together (``limit`` 0: no limit): each expanded node's
    KV position and recurrent states."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self._trees: weakref.WeakSet[DraftTree] = weakref.WeakSet()  # a closed session's tree goes with it

    def join(self, tree: DraftTree) -> None:
        """Count ``tree``'s nodes from now on."""
        self._trees.add(tree)

    @property
    def used(self) -> int:
        """Bytes the trees hold now."""
        return sum(tree.held_bytes for tree in self._trees)

    def free(self) -> int | None:
        """Bytes the trees may still take (None: no limit)."""
        return max(0, self.limit - self.used) if self.limit else None


class DraftTree:
    """One session's tree: expands nodes a pass at a time; see the module docstring."""

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
        temperature = drafter.params.temperature
        # At T > 0 a node's chances are the draft's sampled distribution's: the target's draws, which
        # verify a tree there, follow the target's at that temperature.
        self.inverse_temperature = 1.0 / temperature if temperature > 0 else 1.0
        self.width = config.alternatives  # a node's children: its first choice and ``fanout`` others
        self.budget = config.budget or DEFAULT_PASSES
        self.passes = 0  # since the last verdict
        self.recurrent = [i for i, layer in enumerate(drafter.cache) if isinstance(layer, ArraysCache)]
        self.table = NodeTable()
        self.arena = TreeArena(len(drafter.cache), self.recurrent)
        self.state_bytes = 0  # one node's recurrent states
        self.node_bytes = 0  # what one expanded node holds: its KV position and recurrent states
        self.memory = memory or TreeMemory()
        self.memory.join(self)
        self._lock = threading.Lock()
        self._overhead_s: deque[float] = deque(maxlen=PASS_TIMES)  # recent passes' time over the curve's
        self.curve: tuple[tuple[int, float], ...] = ()  # (rows, seconds) of a pass: the worker's, if known
        self.pass_ends: float | None = None  # when the pass under way is expected to end (perf_counter s)

    @property
    def held(self) -> int:
        """Expanded nodes holding memory of their own."""
        return self.arena.slots

    @property
    def held_bytes(self) -> int:
        """What they hold."""
        return self.arena.slots * self.node_bytes

    @property
    def frontier(self) -> int:
        """Nodes whose token is known and not yet expanded."""
        with self._lock:
            return len(self.table.unexpanded())

    def plant(self, first: Sequence[int], candidates: Sequence[SparseDistribution]) -> None:
        """Root the tree at the drafter's context, with the drafts ``first`` it just made there.

        The drafter's cache holds the context and every draft but the last;
        ``candidates[i]`` are the draft's top choices where ``first[i]`` was drafted.
        """
        context = self.drafter.context
        prefix = len(context) - 1
        kv_layers = [layer for layer in self.drafter.cache if isinstance(layer, KVCache)]
        held = kv_layers[0].offset if kv_layers else len(context) + len(first) - 1
        kv = [
            None if i in self.recurrent else cache_view(layer, held)
            for i, layer in enumerate(self.drafter.cache)
        ]
        states = [self._kept_states(prefix + 1 + i) for i in range(held - prefix)] if self.recurrent else []
        self.arena.reset(kv, prefix, held - prefix, states)
        arrays: list[Any] = [a for layer in kv if layer is not None for a in (layer.keys, layer.values)]
        kv_position = sum(a.nbytes // (a.shape[0] * a.shape[2]) for a in arrays)
        self.state_bytes = sum(a.nbytes for rows in (states[0] if states else {}).values() for a in rows)
        self.node_bytes = self.state_bytes + kv_position
        if self.recurrent and prefix in self.drafter.checkpoints.kept:
            self.arena.feed_states(0, self._kept_states(prefix))  # the root's own start, were it re-fed
        with self._lock:
            t = self.table
            t.reset(context[-1])
            node = 0
            for slot, (token, cand) in enumerate(zip(first, candidates, strict=True)):
                ids, probs = _with_first(cand, token)
                self._add_children(np.array([node]), [ids], [probs])
                self._publish(np.array([node]), np.array([slot]), ids[:1], 0)
                node = t.child(node, token)

    def ready(self, appended: Sequence[int], k: int) -> tuple[list[int], int]:
        """The drafts ready after a verdict that appends ``appended`` (at most ``k`` first choices),
        and the compute (ns) of the passes that drafted them."""
        t = self.table
        with self._lock:
            path = t.walk(appended)
            if len(path) <= len(appended):
                return [], 0
            node, spent = path[-1], 0
            drafts: list[int] = []
            while node != NONE and t.first[node] != NONE and len(drafts) < k:
                drafts.append(int(t.first[node]))
                spent += int(t.compute_ns[node])
                node = t.child(node, int(t.first[node]))
            return drafts, spent

    def ready_tree(
        self, appended: Sequence[int], nodes: int, depth: int
    ) -> tuple[list[int], list[int], list[float], int]:
        """The tree ready after a verdict that appends ``appended``: at most ``nodes`` nodes, ``depth``
        deep, best first (each after its parent), as tokens, parent indices (-1: the verdict's last
        token) and each node's chance of lying on the target's path; and the compute (ns) of the
        passes that expanded them."""
        t = self.table
        with self._lock:
            path = t.walk(appended)
            top = path[-1]
            if len(path) <= len(appended) or t.first[top] == NONE or nodes <= 0 or depth <= 0:
                return [], [], [], 0
            below = t.depth[: t.size] - t.depth[top]
            inside = t.subtree(top) & (below >= 1) & (below <= depth)
            candidates = np.flatnonzero(inside)
            candidates = candidates[t.first[t.parent[candidates]] != NONE]  # their parents' passes done
            probs = t.prob[candidates]
            ranked = candidates[np.lexsort((candidates, below[candidates], -probs))]
            index: dict[int, int] = {top: -1}
            tokens: list[int] = []
            parents: list[int] = []
            chances: list[float] = []
            spent = int(t.compute_ns[top])
            base = float(t.prob[top])
            for node in ranked.tolist():
                parent = index.get(int(t.parent[node]))
                if parent is None:  # ranked above its parent (a chance rounded up): not after it
                    continue
                index[node] = len(tokens)
                tokens.append(int(t.token[node]))
                parents.append(parent)
                chances.append(float(t.prob[node]) / base)
                if t.first[node] != NONE and below[node] < depth:
                    spent += int(t.compute_ns[node])
                if len(tokens) == nodes:
                    break
            return tokens, parents, chances, spent

    def observe(self, appended: Sequence[int]) -> None:
        """Learn the session's acceptance from a verdict that appends ``appended``: at each node of its
        path the tree expanded, whether the target's token was the draft's first choice (a tree's
        verdict may take any child, so accepted over verified would not say)."""
        t = self.table
        node = 0
        for token in appended:
            if node == NONE or t.first[node] == NONE:
                return
            self.rate.observe(int(t.first[node] == token), 1)
            node = t.child(node, int(token))

    def advance(self, appended: Sequence[int]) -> None:
        """The verdict appended ``appended`` to the verified prefix: re-root there, drop the rest.

        Tokens past what the tree fed (drafts the coordinator made that the
        tree had not reached) are fed in one pass.
        """
        t = self.table
        path = np.array(t.walk(appended))
        self.passes = 0
        if len(path) > len(appended):  # the tree holds the new root
            kept = np.flatnonzero(t.subtree(int(path[-1])))
            slots = t.slot[kept]
            kept_slots = np.sort(slots[slots >= 0])
            self.arena.keep(t.slot[path[:-1]], kept_slots)
            with self._lock:
                t.keep(kept)
                old = t.slot[: t.size]  # a kept slot's new number is its rank among the kept
                t.slot[: t.size] = np.where(old >= 0, np.searchsorted(kept_slots, old), NONE)
            return
        fed_slots = t.slot[path]
        fed_slots = fed_slots[fed_slots >= 0]  # the path's expanded nodes: a prefix of it
        self.arena.keep(fed_slots, np.zeros(0, np.int64))
        self._feed([int(t.token[0]), *appended[:-1]][len(fed_slots) :])
        with self._lock:
            t.reset(int(appended[-1]))

    def pass_estimate(self, rows: int | None = None) -> float:
        """Seconds a pass over ``rows`` rows (None: ``self.rows``) is expected to take: the worker's curve
        there, plus the median of what the recent passes took beyond it (without a curve, their median)."""
        return measured_pass_s(self.curve, self.rows if rows is None else rows) + self._overhead()

    def _overhead(self) -> float:
        """The median of what the recent passes took beyond the curve (0 before any)."""
        return float(np.median(np.array(self._overhead_s))) if self._overhead_s else 0.0

    def rows_within(self, seconds: float) -> int:
        """The most rows, up to ``self.rows``, whose pass is expected to end within ``seconds`` (0: none;
        without a curve, all of them or none)."""
        budget = seconds - self._overhead()  # what the curve leaves
        if measured_pass_s(self.curve, 1) > budget:
            return 0
        low, high = 1, self.rows
        while low < high:  # the largest that fits: a pass's time grows with its rows
            mid = (low + high + 1) // 2
            low, high = (mid, high) if measured_pass_s(self.curve, mid) <= budget else (low, mid - 1)
        return low

    def set_curve(self, points: Sequence[tuple[int, float]]) -> None:
        """Time passes by ``points`` ((rows, seconds), as the worker measured them at start), made
        non-decreasing: no pass costs more than a wider one (a first, cold measurement can)."""
        self.curve = tuple(non_decreasing(points))

    def add_known(self, tokens: Sequence[int], parents: Sequence[int]) -> None:
        """A tree being verified (each node after ``parents[i]``: -1 for the root, else an earlier node):
        its nodes that this tree lacks, under a node it has expanded, join as unexpanded nodes (the
        coordinator drafted them on a model of its own), each with the smallest share a child of its
        parent has."""
        t = self.table
        index: list[int] = []
        with self._lock:
            for token, parent in zip(tokens, parents, strict=True):
                above = 0 if parent < 0 else index[parent]
                node = t.child(above, int(token)) if above != NONE else NONE
                if node == NONE and above != NONE and t.first[above] != NONE:
                    share = float(t.prob[above]) * (1 - self.rate.alpha) / max(1, self.width)
                    node = int(t.add(np.array([token]), np.array([above]), np.array([share]))[0])
                index.append(node)

    def step(self, rows: int | None = None) -> bool:
        """One pass over the likeliest known nodes, at most ``rows`` (None: ``self.rows``) of them; False
        when the budget or the tree is spent."""
        if self.passes >= self.budget:
            return False
        nodes = self._take(self.rows if rows is None else rows)
        if not len(nodes):
            return False
        started, started_ns = time.perf_counter(), time.perf_counter_ns()
        self.pass_ends = started + self.pass_estimate(len(nodes))
        t = self.table
        parents = t.parent[nodes]
        parent_slots = np.where(parents >= 0, t.slot[np.maximum(parents, 0)], NONE)
        visible = self.arena.visible(parent_slots)
        positions = (self.arena.prefix + t.depth[nodes]).tolist()
        tokens = t.token[nodes].tolist()
        after: dict[int, LayerRows] = {}
        if self.recurrent:
            model = self.drafter.model
            starts = self.arena.starts(parent_slots)
            logits, after = forward_nodes_keeping_states(
                model, self.arena.kv, tokens, positions, visible, starts
            )
        else:
            with placed(self.drafter.model, self.arena.kv, mx.array(positions), mx.array(visible)):
                logits = self.drafter.batch_pass(mx.array([tokens]), self.arena.kv)
        if self.drafter.processing is None:
            ids, probs = top_choices_now(logits[0] * self.inverse_temperature, self.width)
            choices = ids.tolist(), probs.tolist()
        else:
            paths = [self.table.path(node) for node in nodes.tolist()]
            choices = processed_choices(
                logits[0], paths, self.drafter.processing, self.width, self.inverse_temperature
            )
        slots = self.arena.grow(visible, after)
        with self._lock:  # the children, unseen by readers until their parents are published below
            first = self._add_children(nodes, *choices)
        self.drafter.forward_passes += 1
        self.passes += 1
        if self.recurrent:
            hold_pass(self.drafter.model, started, len(nodes), self.arena.latest())
        else:
            self.drafter.settle(*self.arena.latest())
        with self._lock:  # the pass is done, as the emulated Mac would have it: its drafts are ready
            self._publish(nodes, slots, first, time.perf_counter_ns() - started_ns)
        self._overhead_s.append(time.perf_counter() - started - measured_pass_s(self.curve, len(nodes)))
        self.pass_ends = None
        return True

    def _take(self, rows: int) -> np.ndarray:
        """The likeliest unexpanded nodes, at most ``rows``, and no more than the memory bound and the
        model's context leave room for."""
        t = self.table
        nodes = t.unexpanded()
        nodes = nodes[self.arena.prefix + t.depth[nodes] + 1 < self.context_length]
        free = self.memory.free()
        if free is not None and self.node_bytes:
            rows = min(rows, free // self.node_bytes)
        if rows <= 0:
            return nodes[:0]
        if len(nodes) > rows:
            nodes = nodes[np.argpartition(-t.prob[nodes], rows - 1)[:rows]]
        return nodes[np.lexsort((nodes, -t.prob[nodes]))]

    def _add_children(self, nodes: np.ndarray, ids: list[list[int]], probs: list[list[float]]) -> list[int]:
        """``ids`` are each of ``nodes``' next tokens, the first choice first, with their ``probs``: add
        them as children; returns the first choices (NONE for a node with none: a grammar allows
        nothing after it). A reader sees none of them until ``_publish``."""
        t = self.table
        alpha = self.rate.alpha
        tokens: list[int] = []
        parents: list[int] = []
        chances: list[float] = []
        for node, row, ps in zip(nodes.tolist(), ids, probs, strict=True):
            if not row:
                continue
            base = float(t.prob[node])
            rest = max(1e-12, 1.0 - ps[0])
            tokens.extend(row)
            parents.extend([node] * len(row))
            chances.append(base * alpha)
            chances.extend(base * (1 - alpha) * q / rest for q in ps[1:])
        t.add(np.array(tokens, np.int64), np.array(parents, np.int64), np.array(chances))
        return [row[0] if row else NONE for row in ids]

    def _publish(self, nodes: np.ndarray, slots: np.ndarray, first: list[int], compute_ns: int) -> None:
        """``nodes`` were fed into ``slots`` by a pass of ``compute_ns``: mark them expanded, so readers
        follow ``first`` into their children."""
        t = self.table
        t.slot[nodes], t.compute_ns[nodes] = slots, compute_ns
        t.first[nodes] = first

    def _kept_states(self, position: int) -> dict[int, LayerRows]:
        """The drafter's recurrent states after its first ``position`` tokens (kept after each pass)."""
        kept = self.drafter.checkpoints.kept.get(position)
        if kept is None:
            raise RuntimeError(f"the drafter kept no recurrent state at position {position}")
        return {i: (kept[i][0][0], kept[i][0][1]) for i in self.recurrent}

    def _feed(self, tokens: Sequence[int]) -> None:
        """Feed ``tokens`` after the prefix (one pass): they join it."""
        if not tokens:
            return
        cache: list[Any] = []
        for i, layer in enumerate(self.arena.kv):
            if i in self.recurrent:
                rows = ArraysCache(2)
                rows[0], rows[1] = self.arena.prefix_states[i]
                cache.append(rows)
            else:
                cache.append(layer)
        self.drafter.batch_pass(mx.array([list(tokens)]), cache)
        fed: list[Any] = [
            a for layer in cache for a in (layer.cache if isinstance(layer, ArraysCache) else layer.state)
        ]
        self.drafter.settle(*fed)
        self.drafter.forward_passes += 1
        self.arena.feed_states(len(tokens), {i: (cache[i][0], cache[i][1]) for i in self.recurrent})


def _with_first(cand: SparseDistribution, first: int) -> tuple[list[int], list[float]]:
    """A drafted position's candidates, ``first`` (the draft made there) at the head."""
    ranked = [(int(t), float(q)) for t, q in zip(cand.ids, cand.probs, strict=True)]
    head = [c for c in ranked if c[0] == first] or [(first, ranked[0][1] if ranked else 1.0)]
    ranked = head + [c for c in ranked if c[0] != first]
    return [t for t, _ in ranked], [q for _, q in ranked]
