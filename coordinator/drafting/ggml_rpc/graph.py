"""The operations of one forward pass, in the order mlx-lm's model runs them.

A llama block (17 operations):

    RMS_NORM  MATMUL q  MATMUL k  MATMUL v  ROPE q  ROPE k  KV_WRITE  ATTENTION
    MATMUL o  ADD  RMS_NORM  MATMUL gate  MATMUL up  SILU  MUL  MATMUL down  ADD

Qwen3.5's blocks, as its ``qwen3_5`` model runs them (the MLP as llama's):

    Gated DeltaNet (18):  RMS_NORM  MATMUL qkv  MATMUL z  MATMUL b  MATMUL a
        CONV_STATE  QKV_SPLIT  GATED_DELTA  GATED_NORM  MATMUL out  ADD  + MLP
    gated attention (21): RMS_NORM  MATMUL q  MATMUL k  MATMUL v  HEAD_SPLIT
        HEAD_NORM q  HEAD_NORM k  ROPE_HEADS q  ROPE_HEADS k  KV_WRITE
        ATTENTION  SIGMOID_GATE  MATMUL o  ADD  + MLP

Before the blocks SET_TENSOR (the token ids) and EMBED, after them the final
RMS_NORM, LM_HEAD and GET_TENSOR (the full logits row): ``specwire.models.op_counts``
counts them. Activations live in a fixed set of worker-side slots that every
pass reuses, as a GGML client reuses its graph's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from specwire.models.op_counts import block_kinds, text_config
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
    Q_HEADS = 20
    Q_NORMED = 21
    K_NORMED = 22
    GATED = 23
    QKV = 24
    Z = 25
    DECAY_IN = 26
    BETA_IN = 27
    CONVOLVED = 28
    DELTA = 29
    DELTA_NORMED = 30
    ATTN_GATE = 31


@dataclass(frozen=True)
class ModelShape:
    """What the graph walker needs to know about the draft model: its config, not its weights."""

    blocks: tuple[str, ...]  # each block's kind (``specwire.models.op_counts.block_kinds``)
    heads: int
    kv_heads: int

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        """Read the shape from the mlx-lm model arguments a worker sent in Hello (unknown kinds refused)."""
        blocks = tuple(block_kinds(config))
        text = text_config(config)
        heads = int(text["num_attention_heads"])
        return cls(
            blocks=blocks,
            heads=heads,
            kv_heads=int(text.get("num_key_value_heads") or heads),
        )

    @property
    def recurrent(self) -> bool:
        """True when some blocks keep a recurrent state (their cache cannot be trimmed)."""
        return "gated_delta" in self.blocks


class ForwardGraph:
    """Builds the operations of forward passes for one session."""

    def __init__(self, shape: ModelShape, modules: dict[str, int], tag: int) -> None:
        self.shape = shape
        self.modules = modules
        self.tag = tag
        self.head = "lm_head" if "lm_head" in modules else "model.embed_tokens"  # tied embeddings

    def slot(self, slot: Slot) -> int:
        """The handle of an activation slot in this session."""
        return (self.tag << TAG_SHIFT) | int(slot)

    def _op(self, code: pb.OpCode, outputs: list[Slot], inputs: list, args: list[int] | None = None) -> pb.Op:
        """An operation; ``inputs`` are slots or module names."""
        handles = [self.slot(i) if isinstance(i, Slot) else self.modules[i] for i in inputs]
        return pb.Op(code=code, outputs=[self.slot(s) for s in outputs], inputs=handles, args=args or [])

    def forward(self, offset: int, tokens: list[int] | None, length: int = 1) -> list[list[pb.Op]]:
        """One forward pass, grouped [before the blocks, block 0 … block L-1, after the blocks].

        ``tokens`` go up with SET_TENSOR; ``None`` embeds the token an
        ARGMAX left in the NEXT slot (a chained greedy pass of ``length`` 1).
        """
        if tokens is not None:
            data = np.asarray(tokens, dtype="<i4").tobytes()
            pre = [pb.Op(code=pb.SET_TENSOR, outputs=[self.slot(Slot.TOKENS)], args=[len(tokens)], data=data)]
            source = Slot.TOKENS
        else:
            pre, source = [], Slot.NEXT
        pre.append(self._op(pb.EMBED, [Slot.HIDDEN], [source, "model.embed_tokens"]))
        build = {"attention": self._attention, "gated_attention": self._gated_attention}
        build["gated_delta"] = self._gated_delta
        blocks = [
            [*build[kind](i, f"model.layers.{i}", offset), *self._mlp(f"model.layers.{i}")]
            for i, kind in enumerate(self.shape.blocks)
        ]
        post = [
            self._op(pb.RMS_NORM, [Slot.NORMED], [Slot.HIDDEN, "model.norm"]),
            self._op(pb.LM_HEAD, [Slot.LOGITS], [Slot.NORMED, self.head]),
            self._op(pb.GET_TENSOR, [], [Slot.LOGITS]),
        ]
        return [pre, *blocks, post]

    def _qkv(self, p: str) -> list[pb.Op]:
        """An attention block's first operations: its input norm and the Q, K and V projections."""
        attn = f"{p}.self_attn"
        return [
            self._op(pb.RMS_NORM, [Slot.NORMED], [Slot.HIDDEN, f"{p}.input_layernorm"]),
            self._op(pb.MATMUL, [Slot.Q], [Slot.NORMED, f"{attn}.q_proj"]),
            self._op(pb.MATMUL, [Slot.K], [Slot.NORMED, f"{attn}.k_proj"]),
            self._op(pb.MATMUL, [Slot.V], [Slot.NORMED, f"{attn}.v_proj"]),
        ]

    def _attention(self, i: int, p: str, offset: int) -> list[pb.Op]:
        attn, heads, kv_heads = f"{p}.self_attn", self.shape.heads, self.shape.kv_heads
        return [
            *self._qkv(p),
            self._op(pb.ROPE, [Slot.Q_ROPE], [Slot.Q, attn], [heads, offset]),
            self._op(pb.ROPE, [Slot.K_ROPE], [Slot.K, attn], [kv_heads, offset]),
            self._op(pb.KV_WRITE, [Slot.KEYS, Slot.VALUES], [Slot.K_ROPE, Slot.V], [i, kv_heads, offset]),
            self._op(pb.ATTENTION, [Slot.ATTENDED], [Slot.Q_ROPE, Slot.KEYS, Slot.VALUES, attn]),
            self._op(pb.MATMUL, [Slot.ATTN_OUT], [Slot.ATTENDED, f"{attn}.o_proj"]),
            self._op(pb.ADD, [Slot.HIDDEN], [Slot.HIDDEN, Slot.ATTN_OUT]),
        ]

    def _gated_attention(self, i: int, p: str, offset: int) -> list[pb.Op]:
        attn, heads, kv_heads = f"{p}.self_attn", self.shape.heads, self.shape.kv_heads
        return [
            *self._qkv(p),
            self._op(pb.HEAD_SPLIT, [Slot.Q_HEADS, Slot.ATTN_GATE], [Slot.Q], [heads]),
            self._op(pb.HEAD_NORM, [Slot.Q_NORMED], [Slot.Q_HEADS, f"{attn}.q_norm"], [heads]),
            self._op(pb.HEAD_NORM, [Slot.K_NORMED], [Slot.K, f"{attn}.k_norm"], [kv_heads]),
            self._op(pb.ROPE_HEADS, [Slot.Q_ROPE], [Slot.Q_NORMED, attn], [offset]),
            self._op(pb.ROPE_HEADS, [Slot.K_ROPE], [Slot.K_NORMED, attn], [offset]),
            self._op(pb.KV_WRITE, [Slot.KEYS, Slot.VALUES], [Slot.K_ROPE, Slot.V], [i, kv_heads, offset]),
            self._op(pb.ATTENTION, [Slot.ATTENDED], [Slot.Q_ROPE, Slot.KEYS, Slot.VALUES, attn]),
            self._op(pb.SIGMOID_GATE, [Slot.GATED], [Slot.ATTENDED, Slot.ATTN_GATE]),
            self._op(pb.MATMUL, [Slot.ATTN_OUT], [Slot.GATED, f"{attn}.o_proj"]),
            self._op(pb.ADD, [Slot.HIDDEN], [Slot.HIDDEN, Slot.ATTN_OUT]),
        ]

    def _gated_delta(self, i: int, p: str, offset: int) -> list[pb.Op]:
        mixer = f"{p}.linear_attn"
        return [
            self._op(pb.RMS_NORM, [Slot.NORMED], [Slot.HIDDEN, f"{p}.input_layernorm"]),
            self._op(pb.MATMUL, [Slot.QKV], [Slot.NORMED, f"{mixer}.in_proj_qkv"]),
            self._op(pb.MATMUL, [Slot.Z], [Slot.NORMED, f"{mixer}.in_proj_z"]),
            self._op(pb.MATMUL, [Slot.BETA_IN], [Slot.NORMED, f"{mixer}.in_proj_b"]),
            self._op(pb.MATMUL, [Slot.DECAY_IN], [Slot.NORMED, f"{mixer}.in_proj_a"]),
            self._op(pb.CONV_STATE, [Slot.CONVOLVED], [Slot.QKV, mixer], [i, offset]),
            self._op(pb.QKV_SPLIT, [Slot.Q, Slot.K, Slot.V], [Slot.CONVOLVED, mixer]),
            self._op(
                pb.GATED_DELTA,
                [Slot.DELTA],
                [Slot.Q, Slot.K, Slot.V, Slot.DECAY_IN, Slot.BETA_IN, mixer],
                [i],
            ),
            self._op(pb.GATED_NORM, [Slot.DELTA_NORMED], [Slot.DELTA, Slot.Z, mixer]),
            self._op(pb.MATMUL, [Slot.ATTN_OUT], [Slot.DELTA_NORMED, f"{mixer}.out_proj"]),
            self._op(pb.ADD, [Slot.HIDDEN], [Slot.HIDDEN, Slot.ATTN_OUT]),
        ]

    def _mlp(self, p: str) -> list[pb.Op]:
        return [
            self._op(pb.RMS_NORM, [Slot.NORMED], [Slot.HIDDEN, f"{p}.post_attention_layernorm"]),
            self._op(pb.MATMUL, [Slot.GATE], [Slot.NORMED, f"{p}.mlp.gate_proj"]),
            self._op(pb.MATMUL, [Slot.UP], [Slot.NORMED, f"{p}.mlp.up_proj"]),
            self._op(pb.SILU, [Slot.ACTIVATED], [Slot.GATE]),
            self._op(pb.MUL, [Slot.PRODUCT], [Slot.ACTIVATED, Slot.UP]),
            self._op(pb.MATMUL, [Slot.DOWN], [Slot.PRODUCT, f"{p}.mlp.down_proj"]),
            self._op(pb.ADD, [Slot.HIDDEN], [Slot.HIDDEN, Slot.DOWN]),
        ]

    def trim(self, n: int) -> pb.Op:
        """Roll every layer's cache back by ``n`` positions."""
        return pb.Op(code=pb.KV_TRIM, args=[n])

    def argmax(self) -> pb.Op:
        """Put the argmax of the last logits row in the NEXT slot (for a chained greedy pass)."""
        return self._op(pb.ARGMAX, [Slot.NEXT], [Slot.LOGITS])
