"""The operations of one llama forward pass, in the order mlx-lm's model runs them.

Per transformer block (17 operations):

    RMS_NORM  MATMUL q  MATMUL k  MATMUL v  ROPE q  ROPE k  KV_WRITE  ATTENTION
    MATMUL o  ADD  RMS_NORM  MATMUL gate  MATMUL up  SILU  MUL  MATMUL down  ADD

before the blocks SET_TENSOR (the token ids) and EMBED, after them the final
RMS_NORM, LM_HEAD and GET_TENSOR (the full logits row): 17 L + 5 operations
per forward pass. Activations live in a fixed set of worker-side slots that
every pass reuses, as a GGML client reuses its graph's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from specwire.errors import UnsupportedModelError
from specwire.v1 import draft_pb2 as pb

TAG_SHIFT = 32


class Slot(IntEnum):
    """Worker-side activation slots of the forward pass."""

    TOKENS = 1
    HIDDEN = 2
    NORMED = 3
    Q = 4
    K = 5
    V = 6
    Q_ROPE = 7
    K_ROPE = 8
    KEYS = 9
    VALUES = 10
    ATTENDED = 11
    ATTN_OUT = 12
    GATE = 13
    UP = 14
    ACTIVATED = 15
    PRODUCT = 16
    DOWN = 17
    LOGITS = 18
    NEXT = 19


@dataclass(frozen=True)
class LlamaShape:
    """What the graph walker needs to know about the draft model: its config, not its weights."""

    layers: int
    heads: int
    kv_heads: int
    tied: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LlamaShape:
        """Read the shape from the mlx-lm model arguments a worker sent in Hello."""
        if config.get("model_type") != "llama":
            raise UnsupportedModelError(
                f"the per-op backend walks llama models; the worker serves {config.get('model_type')!r}"
            )
        heads = int(config["num_attention_heads"])
        return cls(
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            tied=bool(config.get("tie_word_embeddings", True)),
        )


class ForwardGraph:
    """Builds the operations of forward passes for one session."""

    def __init__(self, shape: LlamaShape, modules: dict[str, int], tag: int) -> None:
        self.shape = shape
        self.modules = modules
        self.tag = tag

    def slot(self, slot: Slot) -> int:
        """The handle of an activation slot in this session."""
        return (self.tag << TAG_SHIFT) | int(slot)

    def _module(self, name: str) -> int:
        return self.modules[name]

    def _op(
        self, code: pb.OpCode, outputs: list[Slot], inputs: list[int], args: list[int] | None = None
    ) -> pb.Op:
        return pb.Op(code=code, outputs=[self.slot(s) for s in outputs], inputs=inputs, args=args or [])

    def forward(self, offset: int, tokens: list[int] | None, length: int = 1) -> list[list[pb.Op]]:
        """One forward pass, grouped [before the blocks, block 0 … block L-1, after the blocks].

        ``tokens`` go up with SET_TENSOR; ``None`` embeds the token an
        ARGMAX left in the NEXT slot (a chained greedy pass of ``length`` 1).
        """
        s = self.slot
        if tokens is not None:
            data = np.asarray(tokens, dtype="<i4").tobytes()
            pre = [pb.Op(code=pb.SET_TENSOR, outputs=[s(Slot.TOKENS)], args=[len(tokens)], data=data)]
            source = Slot.TOKENS
        else:
            pre, source = [], Slot.NEXT
        pre.append(self._op(pb.EMBED, [Slot.HIDDEN], [s(source), self._module("model.embed_tokens")]))
        blocks = [self._block(i, offset) for i in range(self.shape.layers)]
        head = self._module("model.embed_tokens" if self.shape.tied else "lm_head")
        post = [
            self._op(pb.RMS_NORM, [Slot.NORMED], [s(Slot.HIDDEN), self._module("model.norm")]),
            self._op(pb.LM_HEAD, [Slot.LOGITS], [s(Slot.NORMED), head]),
            self._op(pb.GET_TENSOR, [], [s(Slot.LOGITS)]),
        ]
        return [pre, *blocks, post]

    def _block(self, i: int, offset: int) -> list[pb.Op]:
        s, m = self.slot, self._module
        p = f"model.layers.{i}"
        attn = m(f"{p}.self_attn")
        return [
            self._op(pb.RMS_NORM, [Slot.NORMED], [s(Slot.HIDDEN), m(f"{p}.input_layernorm")]),
            self._op(pb.MATMUL, [Slot.Q], [s(Slot.NORMED), m(f"{p}.self_attn.q_proj")]),
            self._op(pb.MATMUL, [Slot.K], [s(Slot.NORMED), m(f"{p}.self_attn.k_proj")]),
            self._op(pb.MATMUL, [Slot.V], [s(Slot.NORMED), m(f"{p}.self_attn.v_proj")]),
            self._op(pb.ROPE, [Slot.Q_ROPE], [s(Slot.Q), attn], [self.shape.heads, offset]),
            self._op(pb.ROPE, [Slot.K_ROPE], [s(Slot.K), attn], [self.shape.kv_heads, offset]),
            self._op(
                pb.KV_WRITE,
                [Slot.KEYS, Slot.VALUES],
                [s(Slot.K_ROPE), s(Slot.V)],
                [i, self.shape.kv_heads, offset],
            ),
            self._op(pb.ATTENTION, [Slot.ATTENDED], [s(Slot.Q_ROPE), s(Slot.KEYS), s(Slot.VALUES), attn]),
            self._op(pb.MATMUL, [Slot.ATTN_OUT], [s(Slot.ATTENDED), m(f"{p}.self_attn.o_proj")]),
            self._op(pb.ADD, [Slot.HIDDEN], [s(Slot.HIDDEN), s(Slot.ATTN_OUT)]),
            self._op(pb.RMS_NORM, [Slot.NORMED], [s(Slot.HIDDEN), m(f"{p}.post_attention_layernorm")]),
            self._op(pb.MATMUL, [Slot.GATE], [s(Slot.NORMED), m(f"{p}.mlp.gate_proj")]),
            self._op(pb.MATMUL, [Slot.UP], [s(Slot.NORMED), m(f"{p}.mlp.up_proj")]),
            self._op(pb.SILU, [Slot.ACTIVATED], [s(Slot.GATE)]),
            self._op(pb.MUL, [Slot.PRODUCT], [s(Slot.ACTIVATED), s(Slot.UP)]),
            self._op(pb.MATMUL, [Slot.DOWN], [s(Slot.PRODUCT), m(f"{p}.mlp.down_proj")]),
            self._op(pb.ADD, [Slot.HIDDEN], [s(Slot.HIDDEN), s(Slot.DOWN)]),
        ]

    def trim(self, n: int) -> pb.Op:
        """Roll every layer's KV cache back by ``n`` positions."""
        return pb.Op(code=pb.KV_TRIM, args=[n])

    def argmax(self) -> pb.Op:
        """Put the argmax of the last logits row in the NEXT slot (for a chained greedy pass)."""
        return self._op(pb.ARGMAX, [Slot.NEXT], [self.slot(Slot.LOGITS)])
