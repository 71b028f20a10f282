"""A Qwen3.5 verification pass that keeps each Gated DeltaNet layer's state after every position.

A Gated DeltaNet layer holds a convolution state (the last kernel - 1 rows
of its projected input) and a recurrent state (one matrix per value head).
The model's own pass leaves only the state after its last position. To roll
back after rejected drafts without running the accepted positions again,
this pass runs the same modules in the same order as mlx-lm's ``qwen3_5``
model, with one difference inside each Gated DeltaNet layer: the delta rule
advances one position at a time (mlx-lm's own ``gated_delta_update``, one
call per position, from the state the previous call left), and the state
after each position is kept; so are the convolution rows. The logits and the
final states are those of the model's own pass (the rule is sequential over
positions either way; tests check it); the states after earlier positions
cost memory, not weights read again.

Only dense Qwen3.5 single-sequence passes (no batch padding, no pipeline)
are run this way (``keeps_states``); other models with recurrent layers roll
back by replaying the accepted positions (``coordinator.decoding.rollback``).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask, create_ssm_mask
from mlx_lm.models.gated_delta import gated_delta_update

from specwire.models.gated_delta_net import split_heads

LayerStates = list[tuple[mx.array, mx.array]]  # per position: (convolution rows, recurrent state)


def keeps_states(model: nn.Module, cache: list) -> bool:
    """True when ``model`` is a dense Qwen3.5 model this pass can run over ``cache``."""
    language = getattr(model, "language_model", None)
    text = getattr(language, "model", None)
    if text is None or getattr(getattr(language, "args", None), "num_experts", 0) > 0:
        return False
    if getattr(text, "pipeline_size", 1) != 1 or len(text.layers) != len(cache):
        return False
    for layer, c in zip(text.layers, cache, strict=True):
        if getattr(layer, "is_linear", False):
            mixer = getattr(layer, "linear_attn", None)
            if mixer is None or not hasattr(mixer, "in_proj_qkv") or not hasattr(c, "lengths"):
                return False
    return True


def forward_keeping_states(
    model: nn.Module, inputs: mx.array, cache: list
) -> tuple[mx.array, dict[int, LayerStates]]:
    """The logits over ``inputs`` (as ``model(inputs, cache)``), each recurrent layer's states by position."""
    language = model.language_model
    text = language.model
    hidden = text.embed_tokens(inputs)
    attention_mask = create_attention_mask(hidden, cache[text.fa_idx])
    ssm_mask = create_ssm_mask(hidden, cache[text.ssm_idx])
    states: dict[int, LayerStates] = {}
    for i, (layer, c) in enumerate(zip(text.layers, cache, strict=True)):
        normed = layer.input_layernorm(hidden)
        if layer.is_linear:
            mixed, states[i] = _gated_delta_net(layer.linear_attn, normed, ssm_mask, c)
        else:
            mixed = layer.self_attn(normed, attention_mask, c)
        hidden = hidden + mixed
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    out = text.norm(hidden)
    if language.args.tie_word_embeddings:
        return text.embed_tokens.as_linear(out), states
    return language.lm_head(out), states


def _gated_delta_net(
    module: Any, x: mx.array, mask: mx.array | None, cache: Any
) -> tuple[mx.array, LayerStates]:
    """mlx-lm's ``GatedDeltaNet.__call__`` for one sequence, keeping the state after each position."""
    batch, length, _ = x.shape
    qkv = module.in_proj_qkv(x)
    z = module.in_proj_z(x).reshape(batch, length, module.num_v_heads, module.head_v_dim)
    b = module.in_proj_b(x)
    a = module.in_proj_a(x)
    keep = module.conv_kernel_size - 1
    conv_state = cache[0]
    if conv_state is None:
        conv_state = mx.zeros((batch, keep, module.conv_dim), dtype=x.dtype)
    if mask is not None:
        qkv = mx.where(mask[..., None], qkv, 0)
    conv_input = mx.concatenate([conv_state, qkv], axis=1)
    rows = [mx.contiguous(conv_input[:, t + 1 : t + 1 + keep, :]) for t in range(length)]
    conv_out = nn.silu(module.conv1d(conv_input))
    q, k, v = split_heads(module, conv_out, batch, length)
    state = cache[1]
    outs, kept = [], []
    for t in range(length):
        step = slice(t, t + 1)
        out, state = gated_delta_update(
            q[:, step],
            k[:, step],
            v[:, step],
            a[:, step],
            b[:, step],
            module.A_log,
            module.dt_bias,
            state,
            None if mask is None else mask[:, step],
            use_kernel=not module.training,
        )
        outs.append(out)
        kept.append((rows[t], state))
    cache[0], cache[1] = rows[-1], state
    cache.advance(length)
    out = module.norm(mx.concatenate(outs, axis=1), z)
    return module.out_proj(out.reshape(batch, length, -1)), kept
