"""What a worker's tree keeps of the nodes it expanded: one KV cache, and recurrent states by pass.

Each expanded node has a *slot*. Its K/V is the slot's position in one KV
cache per attention layer, after the ``prefix`` (the verified text before
the tree's root): slot s lies at position ``prefix + s``. A pass feeds its
nodes as one sequence (tree attention, ``specwire.models.tree_pass``), so
the cache only ever grows by the pass's nodes, in slot order; no node holds a
copy of its path. Which slots a node sees is its row of ``ancestors``, a
boolean matrix over the slots (kept with room to grow, as the node table
is): its parent's row and its own slot.

A recurrent layer (Qwen3.5's Gated DeltaNet) keeps each expanded node's
window and state after its path instead: the rows of the batch of the pass
that expanded it (a *chunk*), so a pass gathers its nodes' parents' states
with one take per chunk, and nothing is concatenated per node.

At a verdict (``keep``) the slots on the path to the new root join the
prefix, the new root's subtree keeps its slots (renumbered, in order), and
the rest go: the cache's tail after the prefix is gathered into place
(``keep_positions``: the prefix does not move), and each chunk that lost
rows is cut down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from specwire.models.node_pass import LayerRows, stacked
from specwire.models.tree_pass import keep_positions

NONE = -1


class TreeArena:
    """The tree's KV cache, ancestor rows and recurrent states; see the module docstring."""

    def __init__(self, layers: int, recurrent: Sequence[int]) -> None:
        self.recurrent = list(recurrent)
        self.kv: list[Any] = [None] * layers  # KVCache by attention layer, None for a recurrent layer
        self.prefix = 0  # positions before the root
        self.slots = 0
        self._ancestors = np.zeros((0, 0), bool)  # [capacity, capacity]; the first ``slots`` are in use
        self.prefix_states: dict[int, LayerRows] = {}  # recurrent layers after the prefix
        self._chunks: list[dict[int, LayerRows]] = []  # by chunk: each recurrent layer's rows
        self._chunk_of = np.zeros(0, np.int64)  # by slot
        self._row_of = np.zeros(0, np.int64)  # by slot

    @property
    def ancestors(self) -> np.ndarray:
        """[slots, slots]: row s holds the slots on slot s's path, itself included."""
        return self._ancestors[: self.slots, : self.slots]

    @property
    def cached(self) -> int:
        """Positions the KV cache holds: the prefix and every slot."""
        return self.prefix + self.slots

    def reset(
        self, kv: Sequence[Any], prefix: int, slots: int, states: Sequence[dict[int, LayerRows]]
    ) -> None:
        """Hold ``kv`` (a KV cache by layer, None for recurrent ones: the prefix, then ``slots`` slots of
        one path, each after the one before) and, for recurrent layers, each slot's ``states``."""
        self.kv, self.prefix, self.slots = list(kv), prefix, slots
        self._ancestors = np.tril(np.ones((slots, slots), bool))
        self._chunks, self._chunk_of, self._row_of = [], np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self.recurrent and slots:
            chunk = {j: stacked([s[j] for s in states]) for j in self.recurrent}
            self._add_chunk(chunk, slots)

    def visible(self, parent_slots: np.ndarray) -> np.ndarray:
        """The attention mask [nodes, cached + nodes] of a pass over nodes whose parents hold
        ``parent_slots`` (``NONE``: the root, after the prefix alone)."""
        nodes = len(parent_slots)
        mask = np.zeros((nodes, self.cached + nodes), bool)
        mask[:, : self.prefix] = True
        has = parent_slots >= 0
        mask[has, self.prefix : self.cached] = self.ancestors[parent_slots[has]]
        mask[np.arange(nodes), self.cached + np.arange(nodes)] = True
        return mask

    def starts(self, parent_slots: np.ndarray) -> dict[int, LayerRows]:
        """Each recurrent layer's rows to start a pass's nodes from: their parents' states (a parent
        ``NONE``: the prefix's). One take per chunk the parents lie in."""
        has = parent_slots >= 0
        chunks, rows = np.full(len(parent_slots), NONE), np.zeros(len(parent_slots), np.int64)
        chunks[has], rows[has] = self._chunk_of[parent_slots[has]], self._row_of[parent_slots[has]]
        groups = [np.flatnonzero(chunks == c) for c in np.unique(chunks)]
        order = np.concatenate(groups)
        back = None if np.array_equal(order, np.arange(len(order))) else mx.array(np.argsort(order))
        out: dict[int, LayerRows] = {}
        for j in self.recurrent:
            windows, states = [], []
            for group in groups:
                c = int(chunks[group[0]])
                source = self.prefix_states[j] if c == NONE else self._chunks[c][j]
                taken = mx.array(rows[group])
                windows.append(source[0][taken])
                states.append(source[1][taken])
            window, state = _join(windows), _join(states)
            out[j] = (window, state) if back is None else (window[back], state[back])
        return out

    def grow(self, visible: np.ndarray, after: dict[int, LayerRows]) -> np.ndarray:
        """A pass fed ``len(visible)`` nodes (its mask): give them the next slots, returned."""
        nodes = len(visible)
        first = self.slots
        total = first + nodes
        if total > len(self._ancestors):
            room = np.zeros((2 * total, 2 * total), bool)
            room[:first, :first] = self.ancestors
            self._ancestors = room
        self._ancestors[first:total, :total] = visible[:, self.prefix : self.prefix + total]
        self.slots = total
        if self.recurrent:
            self._add_chunk(after, nodes)
        return np.arange(first, total)

    def keep(self, path: np.ndarray, kept: np.ndarray) -> None:
        """A verdict: the slots ``path`` (in order) join the prefix; the slots ``kept`` (ascending) stay,
        renumbered from 0; every other slot goes. The prefix's recurrent state becomes the last path
        slot's (if any)."""
        if self.recurrent and len(path):
            self.prefix_states = self.state_of(int(path[-1]))
        tail = (self.prefix + np.concatenate([path, kept])).tolist()  # ascending: a path before its subtree
        keep_positions([layer for layer in self.kv if layer is not None], self.prefix, tail)
        self.prefix += len(path)
        self._ancestors = self.ancestors[np.ix_(kept, kept)]
        self.slots = len(kept)
        if self.recurrent:
            self._keep_states(kept)

    def feed_states(self, fed: int, states: dict[int, LayerRows]) -> None:
        """The prefix grew by ``fed`` tokens fed after it, after which the recurrent layers hold
        ``states``."""
        self.prefix += fed
        self.prefix_states = states

    def state_of(self, slot: int) -> dict[int, LayerRows]:
        """Each recurrent layer's window and state after slot ``slot``'s path (a row each)."""
        chunk, row = self._chunks[int(self._chunk_of[slot])], int(self._row_of[slot])
        return {j: (chunk[j][0][row : row + 1], chunk[j][1][row : row + 1]) for j in chunk}

    def arrays(self) -> list[mx.array]:
        """Every array the arena holds (to evaluate)."""
        return self.latest() + [a for chunk in self._chunks[:-1] for rows in chunk.values() for a in rows]

    def latest(self) -> list[mx.array]:
        """What the last pass wrote: the KV caches and the newest chunk of recurrent states."""
        out = [a for layer in self.kv if layer is not None and layer.keys is not None for a in layer.state]
        return out + [a for rows in (self._chunks[-1].values() if self._chunks else ()) for a in rows]

    def _add_chunk(self, rows: dict[int, LayerRows], count: int) -> None:
        self._chunks.append(rows)
        self._chunk_of = np.concatenate([self._chunk_of, np.full(count, len(self._chunks) - 1)])
        self._row_of = np.concatenate([self._row_of, np.arange(count)])

    def _keep_states(self, kept: np.ndarray) -> None:
        """Keep the recurrent rows of slots ``kept``: a chunk that lost rows is cut down to the rest."""
        chunk_of, row_of = self._chunk_of[kept], self._row_of[kept]
        chunks: list[dict[int, LayerRows]] = []
        new_chunk_of, new_row_of = np.zeros(len(kept), np.int64), np.zeros(len(kept), np.int64)
        for c in np.unique(chunk_of):
            mine = np.flatnonzero(chunk_of == c)
            rows = row_of[mine]
            old = self._chunks[int(c)]
            size = int(old[self.recurrent[0]][0].shape[0])
            if len(rows) < size:
                take = mx.array(rows)
                old = {j: (w[take], s[take]) for j, (w, s) in old.items()}
                rows = np.arange(len(rows))
            new_chunk_of[mine], new_row_of[mine] = len(chunks), rows
            chunks.append(old)
        self._chunks, self._chunk_of, self._row_of = chunks, new_chunk_of, new_row_of


def _join(parts: list[mx.array]) -> mx.array:
    return parts[0] if len(parts) == 1 else mx.concatenate(parts)
