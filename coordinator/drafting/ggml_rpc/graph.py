"""The operations of one forward pass, in the order the worker's model runs them.

The coordinator learns the draft model's graph from the worker when the
session opens (``TensorOpened``: the walk, ``worker.per_op.op_walk``), never its
weights. A pass is then SET_TENSOR (the token ids; ARGMAX for a chained
greedy pass), one STEP per operation of the walk, and GET_TENSOR (the full
logits row). For a llama block the walk is 13 steps:

    input_layernorm  q_proj  k_proj  v_proj  rope  rope  :kv_write
    :scaled_dot_product_attention  o_proj  post_attention_layernorm
    gate_proj  up_proj  down_proj

Steps group by block (``layers.N`` in their names) for the ``layer``
granularity: one group before the blocks, one per block, one after.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from specwire.errors import InvalidArgumentError
from specwire.v1 import draft_pb2 as pb

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:[.:]|$)")


@dataclass(frozen=True)
class Walk:
    """One forward pass of the worker's model: each step's handle and name, in order."""

    steps: tuple[int, ...]
    names: dict[int, str]
    recurrent: bool

    @classmethod
    def of(cls, opened: pb.TensorOpened) -> Walk:
        """The walk a worker announced; refused if it names a handle it did not define."""
        names = {m.handle: m.name for m in opened.modules}
        unknown = [h for h in opened.walk if h not in names]
        if not opened.walk or unknown:
            raise InvalidArgumentError(
                f"the worker's walk is malformed (steps {len(opened.walk)}, unknown {unknown[:3]})"
            )
        return cls(tuple(opened.walk), names, opened.recurrent)

    def block_of(self, step: int) -> int | None:
        """The block a step belongs to, or None for the steps around the blocks."""
        match = _LAYER.search(self.names[step])
        return int(match.group(1)) if match else None


class ForwardGraph:
    """Builds the operations of forward passes for one session."""

    def __init__(self, walk: Walk) -> None:
        self.walk = walk
        self._groups = self._group()

    def _group(self) -> list[list[int]]:
        """The walk's steps as [before the blocks, block 0 … block L-1, after the blocks]."""
        pre: list[int] = []
        blocks: dict[int, list[int]] = {}
        post: list[int] = []
        for step in self.walk.steps:
            block = self.walk.block_of(step)
            if block is not None:
                blocks.setdefault(block, []).append(step)
            elif blocks:
                post.append(step)
            else:
                pre.append(step)
        return [pre, *(blocks[b] for b in sorted(blocks)), post]

    @property
    def ops_per_pass(self) -> int:
        """Operations of one pass: the upload, the steps and the download."""
        return len(self.walk.steps) + 2

    def forward(self, offset: int, tokens: list[int] | None) -> list[list[pb.Op]]:
        """One forward pass at ``offset``, grouped [before the blocks, block 0 … block L-1, after them].

        ``tokens`` go up with SET_TENSOR; ``None`` starts the pass with ARGMAX
        (a chained greedy pass of one token).
        """
        if tokens is not None:
            data = np.asarray(tokens, dtype="<i4").tobytes()
            first = pb.Op(code=pb.SET_TENSOR, args=[len(tokens), offset], data=data)
        else:
            first = pb.Op(code=pb.ARGMAX, args=[offset])
        groups = [[pb.Op(code=pb.STEP, inputs=[step]) for step in group] for group in self._groups]
        groups[0].insert(0, first)
        groups[-1].append(pb.Op(code=pb.GET_TENSOR))
        return groups

    def trim(self, n: int) -> pb.Op:
        """Roll every layer's cache back by ``n`` positions."""
        return pb.Op(code=pb.KV_TRIM, args=[n])
