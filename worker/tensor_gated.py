"""The per-op executor's Gated DeltaNet operations (Qwen3.5's linear-attention layers).

A Gated DeltaNet layer of mlx-lm's ``qwen3_5`` model runs, after its four
input projections: a causal depthwise convolution over its convolution
state and the new positions (``CONV_STATE``), the split into queries, keys
and values with queries and keys L2-normalised (``QKV_SPLIT``), the gated
delta rule from its recurrent state (``GATED_DELTA``) and a gated RMSNorm
(``GATED_NORM``), before its output projection. Each operation here calls
what the module calls at that step, in the same order, so a walked pass
computes the model's own numbers; both states live in the layer's
``ArraysCache``, as when the model runs whole.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gated_delta import gated_delta_update, normalize_qk

from specwire.errors import InvalidArgumentError
from specwire.v1 import draft_pb2 as pb
from worker.tensor_modules import OpContext


def gated_delta_module(s: OpContext, handle: int) -> nn.Module:
    """The Gated DeltaNet module behind ``handle``, or a clear error."""
    module = s.table.modules.get(handle)
    if module is None or not all(hasattr(module, a) for a in ("conv1d", "A_log", "dt_bias", "norm")):
        raise InvalidArgumentError(f"handle {handle:#x} is not a Gated DeltaNet module of this model")
    return module


def _state(s: OpContext, op: pb.Op, module_input: int) -> tuple[nn.Module, int]:
    """The module and its layer, checked to be the layer whose state ``args[0]`` names."""
    module = gated_delta_module(s, op.inputs[module_input])
    layer, own = op.args[0], s.layer(op.inputs[module_input])
    if layer != own:
        raise InvalidArgumentError(f"layer {layer} is not the module's layer ({own})")
    return module, layer


def conv_state(s: OpContext, op: pb.Op) -> list[bytes]:
    """CONV_STATE: SiLU of the convolution over the kept rows and inputs[0]; the last rows are kept."""
    s.shape(op, 1, 2, 2)
    module, layer = _state(s, op, 1)
    s.check_recurrent_offset(layer, op.args[1])
    qkv = s.get(op.inputs[0])
    if qkv.ndim != 3 or qkv.shape[-1] != module.conv_dim:
        raise InvalidArgumentError(f"expects [batch, positions, {module.conv_dim}], got shape {qkv.shape}")
    cache = s.cache[layer]
    kept = cache[0]
    if kept is None:
        kept = mx.zeros((qkv.shape[0], module.conv_kernel_size - 1, module.conv_dim), dtype=qkv.dtype)
    conv_input = mx.concatenate([kept, qkv], axis=1)
    cache[0] = mx.contiguous(conv_input[:, -(module.conv_kernel_size - 1) :, :])
    s.put(op.outputs[0], nn.silu(module.conv1d(conv_input)))
    return []


def qkv_split(s: OpContext, op: pb.Op) -> list[bytes]:
    """QKV_SPLIT: queries, keys and values per head; queries and keys normalised as the module does."""
    s.shape(op, 3, 2, 0)
    module = gated_delta_module(s, op.inputs[1])
    x = s.get(op.inputs[0])
    if x.ndim != 3 or x.shape[-1] != module.conv_dim:
        raise InvalidArgumentError(f"expects [batch, positions, {module.conv_dim}], got shape {x.shape}")
    b, length, _ = x.shape
    parts = mx.split(x, [module.key_dim, 2 * module.key_dim], -1)
    heads = (module.num_k_heads, module.num_k_heads, module.num_v_heads)
    dims = (module.head_k_dim, module.head_k_dim, module.head_v_dim)
    q, k, v = (t.reshape(b, length, h, d) for t, h, d in zip(parts, heads, dims, strict=True))
    q, k = normalize_qk(q, k, inv_scale=module.head_k_dim**-0.5, eps=1e-6)
    for handle, value in zip(op.outputs, (q, k, v), strict=True):
        s.put(handle, value)
    return []


def gated_delta(s: OpContext, op: pb.Op) -> list[bytes]:
    """GATED_DELTA: the gated delta rule from the layer's recurrent state, which then moves on."""
    s.shape(op, 1, 6, 1)
    module, layer = _state(s, op, 5)
    q, k, v, a, b = (s.get(h) for h in op.inputs[:5])
    if q.ndim != 4 or v.ndim != 4 or a.shape[:2] != q.shape[:2] or b.shape != a.shape:
        raise InvalidArgumentError(
            f"expects per-head queries, keys and values and per-position decay and gate inputs; "
            f"got shapes {q.shape}, {k.shape}, {v.shape}, {a.shape}, {b.shape}"
        )
    cache = s.cache[layer]
    out, state = gated_delta_update(
        q, k, v, a, b, module.A_log, module.dt_bias, cache[1], None, use_kernel=not module.training
    )
    cache[1] = state
    cache.advance(q.shape[1])
    s.advance_recurrent(layer, q.shape[1])
    s.put(op.outputs[0], out)
    return []


def gated_norm(s: OpContext, op: pb.Op) -> list[bytes]:
    """GATED_NORM: the module's gated RMSNorm of the rule's output with gate inputs[1], heads merged."""
    s.shape(op, 1, 3, 0)
    module = gated_delta_module(s, op.inputs[2])
    out, z = s.get(op.inputs[0]), s.get(op.inputs[1])
    if out.ndim != 4 or z.size != out.size:
        raise InvalidArgumentError(
            f"expects per-head output and a gate of its size; got {out.shape} and {z.shape}"
        )
    b, length = out.shape[:2]
    gate = z.reshape(b, length, module.num_v_heads, module.head_v_dim)
    s.put(op.outputs[0], module.norm(out, gate).reshape(b, length, -1))
    return []


OPS = {
    pb.CONV_STATE: conv_state,
    pb.QKV_SPLIT: qkv_split,
    pb.GATED_DELTA: gated_delta,
    pb.GATED_NORM: gated_norm,
}
