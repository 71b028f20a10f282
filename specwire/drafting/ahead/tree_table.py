"""The nodes of a worker's tree as arrays, so that a pass's bookkeeping costs a few NumPy operations.

A tree of drafts grows by a batch of nodes a pass (``specwire.drafting.ahead.draft_tree``):
a 64-row pass adds about 200 nodes. Kept as Python objects, each node cost a
few microseconds to make, link and push on a heap, and the worker's host
work after a 64-row pass took 5.5 ms on a 2-core machine, a quarter of the M1
Max's paced time for that pass. Here a node is an index into arrays (its
token, parent, probability of lying on the target's path, depth under the
root, first choice once expanded, and the arena slot its K/V and states were
kept in), and only the lookup of a child by token is a dictionary.

Index 0 is the root, and a node's parent always has a lower index, so a
parent comes before its children in every ordering by index.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NONE = -1


class NodeTable:
    """The nodes, parents before children; see the module docstring."""

    def __init__(self, capacity: int = 256) -> None:
        self.size = 0
        self.token = np.zeros(capacity, np.int64)
        self.parent = np.full(capacity, NONE, np.int64)
        self.prob = np.zeros(capacity, np.float64)
        self.depth = np.zeros(capacity, np.int64)
        self.first = np.full(capacity, NONE, np.int64)  # the draft's first choice after it, once expanded
        self.slot = np.full(capacity, NONE, np.int64)  # where its K/V and states are kept, once expanded
        self.compute_ns = np.zeros(capacity, np.int64)  # the pass that expanded it
        self._child: dict[tuple[int, int], int] = {}

    def reset(self, token: int) -> None:
        """Only a root, holding ``token``, with probability 1."""
        self.size = 0
        self._child = {}
        self.add(np.array([token]), np.array([NONE]), np.array([1.0]))

    def add(self, tokens: np.ndarray, parents: np.ndarray, probs: np.ndarray) -> np.ndarray:
        """New unexpanded nodes (their parents already in the table); returns their indices."""
        n = len(tokens)
        self._grow(self.size + n)
        index = np.arange(self.size, self.size + n)
        self.token[index], self.parent[index], self.prob[index] = tokens, parents, probs
        self.depth[index] = np.where(parents >= 0, self.depth[np.maximum(parents, 0)] + 1, 0)
        self.first[index] = self.slot[index] = NONE
        self.compute_ns[index] = 0
        self._child.update(
            zip(zip(parents.tolist(), tokens.tolist(), strict=True), index.tolist(), strict=True)
        )
        self.size += n
        return index

    def path(self, node: int) -> list[int]:
        """The tokens from below the root down to ``node``, in order (none for the root)."""
        tokens: list[int] = []
        while node > 0:
            tokens.append(int(self.token[node]))
            node = int(self.parent[node])
        return tokens[::-1]

    def child(self, node: int, token: int) -> int:
        """The child of ``node`` holding ``token``, or ``NONE``."""
        return self._child.get((node, token), NONE)

    def walk(self, tokens: Sequence[int]) -> list[int]:
        """The nodes from the root along ``tokens`` (the root first), as far as the tree holds them."""
        path = [0]
        for token in tokens:
            child = self.child(path[-1], int(token))
            if child == NONE:
                break
            path.append(child)
        return path

    def subtree(self, node: int) -> np.ndarray:
        """A mask of ``node`` and its descendants."""
        inside = np.zeros(self.size, bool)
        inside[node] = True
        below = np.arange(node + 1, self.size)
        parents = self.parent[below]
        for _ in range(int(self.depth[: self.size].max(initial=0)) + 1):  # one level deeper a sweep
            grown = inside[below] | inside[parents]
            if np.array_equal(grown, inside[below]):
                break
            inside[below] = grown
        return inside

    def keep(self, kept: np.ndarray) -> None:
        """Keep the nodes at the ascending indices ``kept`` (a subtree: the first is its root, which
        becomes the root), renumbered in order."""
        renumber = np.full(self.size, NONE, np.int64)
        renumber[kept] = np.arange(len(kept))
        for name in ("token", "prob", "depth", "first", "slot", "compute_ns"):
            array = getattr(self, name)
            array[: len(kept)] = array[kept]
        parents = self.parent[kept]
        self.parent[: len(kept)] = np.where(parents >= 0, renumber[np.maximum(parents, 0)], NONE)
        self.parent[0] = NONE
        self.depth[: len(kept)] -= self.depth[0]
        self.prob[: len(kept)] /= self.prob[0]
        self.size = n = len(kept)
        edges = zip(self.parent[1:n].tolist(), self.token[1:n].tolist(), strict=True)
        self._child = dict(zip(edges, range(1, n), strict=True))

    def unexpanded(self) -> np.ndarray:
        """Indices of the nodes whose token is known and not yet fed."""
        return np.flatnonzero(self.first[: self.size] == NONE)

    def _grow(self, size: int) -> None:
        capacity = len(self.token)
        if size <= capacity:
            return
        while capacity < size:
            capacity *= 2
        for name, fill in (
            ("token", 0),
            ("parent", NONE),
            ("prob", 0),
            ("depth", 0),
            ("first", NONE),
            ("slot", NONE),
            ("compute_ns", 0),
        ):
            old = getattr(self, name)
            new = np.full(capacity, fill, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
