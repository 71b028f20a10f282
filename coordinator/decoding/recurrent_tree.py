"""A Qwen3.5 verification pass over a tree of drafts: every node at its own path's state.

Tree verification (``specwire.models.tree_pass``) feeds every node of a tree
in one pass, each attending to its ancestors only. A Gated DeltaNet layer has
no positions to mask: it carries a convolution window and a recurrent state
from one token to the next. Over a tree, each node must continue its own
parent's, so this pass runs mlx-lm's ``qwen3_5`` modules in their order, as
``coordinator.decoding.recurrent_pass`` does for a chain, with three changes:

* full-attention layers take the tree mask, and each token's rotary position
  is its depth after the verified text;
* a Gated DeltaNet layer's convolution for a node reads the window of its
  own path (its ancestors' projected inputs, then the cache's window), one
  window per node as a batch;
* the delta rule advances a level of the tree at a time, each node a row of
  one batch starting from its parent's state (the first level's parent is
  the cache), and every node's window and state are kept.

After the verdict, the caller puts the accepted path's last node's window and
state into each Gated DeltaNet layer's cache, and keeps the path's K/V in the
attention layers' (``keep_positions``). Only dense Qwen3.5 single-sequence
passes are run this way (``recurrent_pass.keeps_states``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.gated_delta import gated_delta_update

from coordinator.decoding.recurrent_pass import LayerStates
from specwire.models.gated_delta_net import split_heads
from specwire.models.tree_pass import rope_at


def forward_tree_keeping_states(
    model: nn.Module,
    cache: list,
    tokens: Sequence[int],
    parents: Sequence[int],
    positions: Sequence[int],
    visible: np.ndarray,
    starts: Sequence[dict[int, tuple[mx.array, mx.array]] | None] | None = None,
) -> tuple[mx.array, dict[int, LayerStates]]:
    """Logits [1, L, vocab] of ``tokens`` (each after ``parents[i]``, an earlier token, or -1: after the
    cache, or after ``starts[i]``, a Gated DeltaNet (window, state) by layer kept from an earlier pass)
    at rotary ``positions``, attention where ``visible`` ([L, cached + L]) is true; and each Gated
    DeltaNet layer's (window, state) after every token. The Gated DeltaNet caches are left as they
    were: the caller puts back the state of the path it keeps."""
    language = model.language_model
    text = language.model
    hidden = text.embed_tokens(mx.array([list(tokens)]))
    mask = mx.array(visible)
    at = mx.array(list(positions))
    states: dict[int, LayerStates] = {}
    for i, (layer, c) in enumerate(zip(text.layers, cache, strict=True)):
        normed = layer.input_layernorm(hidden)
        if layer.is_linear:
            before = [None if start is None else start[i] for start in starts] if starts else None
            mixed, states[i] = _gated_delta_tree(layer.linear_attn, normed, parents, c, before)
        else:
            with rope_at(layer.self_attn, at):
                mixed = layer.self_attn(normed, mask, c)
        hidden = hidden + mixed
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    out = text.norm(hidden)
    if language.args.tie_word_embeddings:
        return text.embed_tokens.as_linear(out), states
    return language.lm_head(out), states


def _gated_delta_tree(
    module: Any,
    x: mx.array,
    parents: Sequence[int],
    cache: Any,
    starts: Sequence[tuple[mx.array, mx.array] | None] | None = None,
) -> tuple[mx.array, LayerStates]:
    """mlx-lm's ``GatedDeltaNet.__call__`` over a tree: each node from its parent's window and state (a
    token without a parent in the pass: from ``starts[t]``, else the cache's)."""
    batch, length, _ = x.shape
    qkv = module.in_proj_qkv(x)
    z = module.in_proj_z(x).reshape(batch, length, module.num_v_heads, module.head_v_dim)
    b = module.in_proj_b(x)
    a = module.in_proj_a(x)
    keep = module.conv_kernel_size - 1
    window = cache[0]
    if window is None:
        window = mx.zeros((batch, keep, module.conv_dim), dtype=x.dtype)
    start = [None if starts is None else starts[t] for t in range(length)]
    windows: list[mx.array] = []  # each node's last ``keep`` inputs, itself included
    inputs: list[mx.array] = []  # each node's whole convolution input: its parent's window, then itself
    for t, parent in enumerate(parents):
        own = start[t]
        previous = windows[parent] if parent >= 0 else window if own is None else own[0]
        full = mx.concatenate([previous, qkv[:, t : t + 1]], axis=1)
        inputs.append(full)
        windows.append(full[:, 1:])
    conv_out = nn.silu(module.conv1d(mx.concatenate(inputs, axis=0)))  # [L, 1, conv_dim]
    conv_out = conv_out.reshape(batch, length, -1)
    q, k, v = split_heads(module, conv_out, batch, length)
    # The delta rule a level at a time: a level's nodes (their parents all in earlier levels) are the rows
    # of one batch, each from its own parent's state.
    depth: list[int] = []
    for parent in parents:
        depth.append(depth[parent] + 1 if parent >= 0 else 0)
    outs: dict[int, mx.array] = {}
    states: dict[int, mx.array] = {}  # by node: its delta-rule state
    for level in range(max(depth) + 1):
        rows = [t for t in range(length) if depth[t] == level]
        before: list[mx.array] = []
        for t in rows:
            parent, own = parents[t], start[t]
            before.append(states[parent] if parent >= 0 else cache[1] if own is None else own[1])
        if any(state is None for state in before):  # a first pass: every state starts at zero
            shape = (1, module.num_v_heads, module.head_v_dim, module.head_k_dim)
            before = [mx.zeros(shape, dtype=mx.float32) if state is None else state for state in before]
        at = mx.array(rows)
        out, after = gated_delta_update(
            q[0, at][:, None],
            k[0, at][:, None],
            v[0, at][:, None],
            a[0, at][:, None],
            b[0, at][:, None],
            module.A_log,
            module.dt_bias,
            before[0] if len(before) == 1 else mx.concatenate(before),
            None,
            use_kernel=not module.training,
        )
        for j, t in enumerate(rows):
            outs[t], states[t] = out[j : j + 1], after[j : j + 1]
    kept: LayerStates = [(mx.contiguous(windows[t]), states[t]) for t in range(length)]
    out = module.norm(mx.concatenate([outs[t] for t in range(length)], axis=1), z)
    return module.out_proj(out.reshape(batch, length, -1)), kept
