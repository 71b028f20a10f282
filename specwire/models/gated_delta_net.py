"""What every walk of a Gated DeltaNet layer (Qwen3.5) shares: its convolution's output as heads.

specwire runs the layer's parts itself where mlx-lm's call does not fit: a
chain keeping every position's state (``coordinator.decoding.recurrent_pass``),
a tree whose nodes each continue their parent (``recurrent_tree``), a long
run as a scan (``specwire.models.delta_scan``). Each splits the convolution's
output into queries, keys and values the way mlx-lm's layer does.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.gated_delta import normalize_qk


def split_heads(
    module: Any, conv_out: mx.array, batch: int, length: int
) -> tuple[mx.array, mx.array, mx.array]:
    """Queries, keys and values [batch, length, heads, dim] from the convolution's output, the queries
    and keys normalized (the readout scale folded into the queries, as mlx-lm's layer does)."""
    parts = mx.split(conv_out, [module.key_dim, 2 * module.key_dim], -1)
    heads = (module.num_k_heads, module.num_k_heads, module.num_v_heads)
    dims = (module.head_k_dim, module.head_k_dim, module.head_v_dim)
    q, k, v = (t.reshape(batch, length, h, d) for t, h, d in zip(parts, heads, dims, strict=True))
    q, k = normalize_qk(q, k, inv_scale=module.head_k_dim**-0.5, eps=1e-6)
    return q, k, v
