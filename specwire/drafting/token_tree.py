"""A tree of draft tokens: the candidates one verification pass checks at once.

Node i holds ``tokens[i]`` and continues ``parents[i]``: another node, drawn
earlier (``parents[i] < i``), or -1 for a node right after the verified
prefix. A chain of k drafts is the tree whose parents are -1, 0, .., k - 2.
Siblings hold different tokens, so the target's choice after a node names at
most one child to follow. The depth of a node (1 right after the prefix) is
its position after the prefix, which sets its rotary position in the pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specwire.errors import InvalidArgumentError


@dataclass(frozen=True)
class TokenTree:
    """Draft tokens with parent indices (module docstring); ``check`` refuses a malformed one."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...] = field(init=False)
    children: dict[tuple[int, int], int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise InvalidArgumentError(
                f"a draft tree needs one parent per token: {len(self.tokens)} tokens, "
                f"{len(self.parents)} parents"
            )
        depths: list[int] = []
        children: dict[tuple[int, int], int] = {}
        for i, (token, parent) in enumerate(zip(self.tokens, self.parents, strict=True)):
            if not -1 <= parent < i:
                raise InvalidArgumentError(
                    f"draft tree node {i} names parent {parent}; a parent must be an earlier node "
                    "or -1 (the verified prefix)"
                )
            if (parent, token) in children:
                raise InvalidArgumentError(
                    f"draft tree nodes {children[(parent, token)]} and {i} are siblings with the same "
                    f"token {token}"
                )
            children[(parent, token)] = i
            depths.append(1 if parent < 0 else depths[parent] + 1)
        object.__setattr__(self, "depths", tuple(depths))
        object.__setattr__(self, "children", children)

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> TokenTree:
        """k drafts, each continuing the one before."""
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        """The deepest node's depth (0 for an empty tree)."""
        return max(self.depths, default=0)

    def check(self, vocab_size: int, max_nodes: int, max_depth: int) -> None:
        """Refuse a tree larger, deeper or with tokens outside what its receiver can take."""
        if len(self) > max_nodes:
            raise InvalidArgumentError(f"a draft tree of {len(self)} nodes; at most {max_nodes} are taken")
        if self.depth > max_depth:
            raise InvalidArgumentError(f"a draft tree {self.depth} deep; this round takes {max_depth}")
        bad = next((t for t in self.tokens if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidArgumentError(f"draft tree token {bad} is outside a vocabulary of {vocab_size}")

    def child(self, node: int, token: int) -> int | None:
        """The child of ``node`` (-1: the prefix) holding ``token``, if any."""
        return self.children.get((node, token))

    def path(self, node: int) -> list[int]:
        """The nodes from the first after the prefix down to ``node``."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def is_chain(self) -> bool:
        """Whether every node continues the one before."""
        return all(parent == i - 1 for i, parent in enumerate(self.parents))

    def rooted(self, root: int) -> TokenTree:
        """This tree under a first node holding ``root`` (the last verified token): node i becomes i + 1."""
        return TokenTree((root, *self.tokens), (-1, *(parent + 1 for parent in self.parents)))

    def visible(self) -> np.ndarray:
        """[n, n] booleans: node i sees node j when j is i or one of its ancestors."""
        n = len(self)
        seen = np.zeros((n, n), dtype=bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                seen[i] = seen[parent]
            seen[i, i] = True
        return seen
