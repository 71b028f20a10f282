"""The per-op executor's attention operations: llama's, and Qwen3.5's gated attention.

Each calls what mlx-lm's attention module calls at that step: its RoPE, its
KV cache's ``update_and_fetch`` and mask, scaled-dot-product attention, and
for gated attention (Qwen3.5, Qwen3-Next) the per-head query/key norms and
the sigmoid gate on the output. Each takes the session and the operation,
checks both, writes its outputs and returns the tensors it sends back (none).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import scaled_dot_product_attention

from specwire.errors import InvalidArgumentError
from specwire.v1 import draft_pb2 as pb
from worker.tensor_modules import OpContext


def attention_module(s: OpContext, handle: int) -> nn.Module:
    """The attention module behind ``handle`` (one with a RoPE), or a clear error."""
    module = s.table.modules.get(handle)
    if module is None or not hasattr(module, "rope"):
        raise InvalidArgumentError(f"handle {handle:#x} is not an attention module of this model")
    return module


def rope(s: OpContext, op: pb.Op) -> list[bytes]:
    """ROPE: split a projection into heads, heads first, and rotate at an offset."""
    s.shape(op, 1, 2, 2)
    attn = attention_module(s, op.inputs[1])
    heads, offset = op.args
    s.check_offset(s.layer(op.inputs[1]), offset)
    x = s.get(op.inputs[0])
    b, length, _ = x.shape
    s.put(op.outputs[0], attn.rope(x.reshape(b, length, heads, -1).transpose(0, 2, 1, 3), offset=offset))
    return []


def rope_heads(s: OpContext, op: pb.Op) -> list[bytes]:
    """ROPE_HEADS: rotate a heads-first tensor at an offset."""
    s.shape(op, 1, 2, 1)
    attn = attention_module(s, op.inputs[1])
    (offset,) = op.args
    s.check_offset(s.layer(op.inputs[1]), offset)
    s.put(op.outputs[0], attn.rope(s.get(op.inputs[0]), offset=offset))
    return []


def kv_write(s: OpContext, op: pb.Op) -> list[bytes]:
    """KV_WRITE: append keys and values to a layer's KV cache; the whole keys and values come out."""
    s.shape(op, 2, 2, 3)
    layer, kv_heads, offset = op.args
    if not 0 <= layer < len(s.cache) or not hasattr(s.cache[layer], "update_and_fetch"):
        raise InvalidArgumentError(f"layer {layer} has no KV cache (layers 0..{len(s.cache) - 1})")
    s.check_offset(layer, offset)
    keys, values = s.get(op.inputs[0]), s.get(op.inputs[1])
    b, length, _ = values.shape
    values = values.reshape(b, length, kv_heads, -1).transpose(0, 2, 1, 3)
    all_keys, all_values = s.cache[layer].update_and_fetch(keys, values)
    s.put(op.outputs[0], all_keys)
    s.put(op.outputs[1], all_values)
    return []


def attention(s: OpContext, op: pb.Op) -> list[bytes]:
    """ATTENTION: causal scaled-dot-product attention over the cache, heads merged back."""
    s.shape(op, 1, 4, 0)
    attn = attention_module(s, op.inputs[3])
    layer = s.layer(op.inputs[3])
    queries = s.get(op.inputs[0])
    b, _, length, _ = queries.shape
    mask = s.cache[layer].make_mask(length, return_array=False, window_size=None)
    out = scaled_dot_product_attention(
        queries, s.get(op.inputs[1]), s.get(op.inputs[2]), cache=s.cache[layer], scale=attn.scale, mask=mask
    )
    s.put(op.outputs[0], out.transpose(0, 2, 1, 3).reshape(b, length, -1))
    return []


def head_split(s: OpContext, op: pb.Op) -> list[bytes]:
    """HEAD_SPLIT: a gated query projection into queries (per head) and the gate (heads merged)."""
    s.shape(op, 2, 1, 1)
    (heads,) = op.args
    x = s.get(op.inputs[0])
    b, length, _ = x.shape
    queries, gate = mx.split(x.reshape(b, length, heads, -1), 2, axis=-1)
    s.put(op.outputs[0], queries)
    s.put(op.outputs[1], gate.reshape(b, length, -1))
    return []


def head_norm(s: OpContext, op: pb.Op) -> list[bytes]:
    """HEAD_NORM: an RMSNorm over each head, then heads first."""
    s.shape(op, 1, 2, 1)
    norm = s.module(op.inputs[1], (nn.RMSNorm,), "RMSNorm")
    (heads,) = op.args
    x = s.get(op.inputs[0])
    b, length = x.shape[0], x.shape[1]
    s.put(op.outputs[0], norm(x.reshape(b, length, heads, -1)).transpose(0, 2, 1, 3))
    return []


def sigmoid_gate(s: OpContext, op: pb.Op) -> list[bytes]:
    """SIGMOID_GATE: inputs[0] * sigmoid(inputs[1])."""
    s.shape(op, 1, 2, 0)
    s.put(op.outputs[0], s.get(op.inputs[0]) * mx.sigmoid(s.get(op.inputs[1])))
    return []


OPS = {
    pb.ROPE: rope,
    pb.ROPE_HEADS: rope_heads,
    pb.KV_WRITE: kv_write,
    pb.ATTENTION: attention,
    pb.HEAD_SPLIT: head_split,
    pb.HEAD_NORM: head_norm,
    pb.SIGMOID_GATE: sigmoid_gate,
}
