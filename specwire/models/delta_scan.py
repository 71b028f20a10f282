"""The gated delta rule over a long run of positions as a scan, for the emulation's hybrid model on a CPU.

A Gated DeltaNet layer (Qwen3.5) carries a state S (values by keys, per
head) from one position to the next:

    S_t = g_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T,    y_t = S_t q_t

mlx-lm runs it with a fused kernel on Metal; elsewhere it loops over the
positions in Python, a few operations each. On MLX's CPU backend that is
about 65 µs a position a layer: a draft model catching up 150 tokens paid
10 ms, more than the M2 Ultra's paced time for that pass, and the paced
hybrid rows overran there (docs/measurements.md, "Making the emulation cheap enough").
Each step is an affine map S -> S A_t + B_t, and affine maps compose, so the run is an inclusive scan:
log2(n) levels of batched matrix products, chunk by chunk (``CHUNK``
positions, so the matrices a chunk holds stay small).

The scan rounds differently from the loop, so it serves only runs longer
than any round (``MIN_POSITIONS``): a prompt, a draft model catching up.
Every pass a round makes (drafting, verifying, a tree) keeps mlx-lm's loop,
bit for bit the same as decoding one token at a time.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gated_delta import compute_g

from specwire.models.gated_delta_net import split_heads

# Shorter runs keep the loop: every round's pass is shorter (specwire.emulation.pace.ROUND_POSITIONS, k + 1 at
# the protocol's largest k, is 33).
MIN_POSITIONS = 34
CHUNK = 64


def scan_delta_rule(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    """The gated delta rule over every position: q, k [B, T, H, Dk] (as many heads as v), v [B, T, H, Dv],
    g and beta [B, T, H], state [B, H, Dv, Dk]; returns y [B, T, H, Dv] and the state after the last."""
    outs = []
    for start in range(0, q.shape[1], CHUNK):
        part = slice(start, start + CHUNK)
        y, state = _scan_chunk(q[:, part], k[:, part], v[:, part], g[:, part], beta[:, part], state)
        outs.append(y)
    return (outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=1)), state


def _scan_chunk(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array]:
    dk = k.shape[-1]
    kk = k[..., :, None] * k[..., None, :]  # [B, T, H, Dk, Dk]
    a = g[..., None, None] * (mx.eye(dk, dtype=kk.dtype) - beta[..., None, None] * kk)
    b = beta[..., None, None] * (v[..., :, None] * k[..., None, :])  # [B, T, H, Dv, Dk]
    length, offset = q.shape[1], 1
    while offset < length:  # position t takes the map of the positions before it, ``offset`` further back
        earlier_a, earlier_b, later_a = a[:, :-offset], b[:, :-offset], a[:, offset:]
        a = mx.concatenate([a[:, :offset], earlier_a @ later_a], axis=1)
        b = mx.concatenate([b[:, :offset], earlier_b @ later_a + b[:, offset:]], axis=1)
        offset *= 2
    states = state[:, None] @ a + b  # [B, T, H, Dv, Dk]: the state after each position
    y = (states @ q[..., :, None])[..., 0]
    return y.astype(q.dtype), states[:, -1]


def forward_scanned(module: Any, x: mx.array, cache: Any) -> mx.array:
    """A Gated DeltaNet layer's pass over one run of positions (no mask, no padding), its recurrence by
    ``scan_delta_rule``; the cache then holds the window and state after the run, as mlx-lm's does."""
    batch, length, _ = x.shape
    qkv = module.in_proj_qkv(x)
    z = module.in_proj_z(x).reshape(batch, length, module.num_v_heads, module.head_v_dim)
    beta = mx.sigmoid(module.in_proj_b(x))
    g = compute_g(module.A_log, module.in_proj_a(x), module.dt_bias)
    keep = module.conv_kernel_size - 1
    window = cache[0] if cache[0] is not None else mx.zeros((batch, keep, module.conv_dim), dtype=x.dtype)
    conv_input = mx.concatenate([window, qkv], axis=1)
    cache[0] = mx.contiguous(conv_input[:, -keep:, :])
    conv_out = nn.silu(module.conv1d(conv_input))
    q, k, v = split_heads(module, conv_out, batch, length)
    if (repeat := module.num_v_heads // module.num_k_heads) > 1:
        q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
    state = cache[1]
    if state is None:
        state = mx.zeros((batch, module.num_v_heads, module.head_v_dim, module.head_k_dim), dtype=mx.float32)
    y, cache[1] = scan_delta_rule(q, k, v, g, beta, state)
    cache.advance(length)
    out = module.norm(y, z)
    return module.out_proj(out.reshape(batch, length, -1))


def scans(x: mx.array, mask: Any, cache: Any) -> bool:
    """Whether a pass takes the scan: on the CPU, a long run of one unpadded sequence, with a cache."""
    return (
        mx.default_device() == mx.cpu
        and x.shape[1] >= MIN_POSITIONS
        and mask is None
        and cache is not None
        and getattr(cache, "lengths", None) is None
        and getattr(cache, "left_padding", None) is None
    )
