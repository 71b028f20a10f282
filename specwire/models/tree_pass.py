"""A forward pass in which each token sees only what it continues (tree attention), and the cache after it.

A pass over a tree of drafts feeds all its nodes at once. Each node must see
the cached prefix and its own ancestors, and no sibling or cousin, at the
position of its depth, so that its logits and its K/V are those a plain pass
over its own path gives. mlx-lm's attention layers take their mask from the
cache (``make_mask``) and rotate queries and keys at the cache's offset, one
position after another. For the length of one pass, ``forward_at`` gives
each layer's cache the tree's mask and each attention layer a rotary
embedding that places every token at its own position (the tokens become
the batch axis of ``mx.fast.rope``, each with its own offset), and puts them
back afterwards. On MLX's CPU backend a node's logits and K/V are then those
of a chain pass over its path, bit for bit (tests/specwire/models/test_tree_pass.py).

The cache then holds every node fed, in the order fed. ``keep_positions``
moves the K/V of the positions kept (an accepted path) into place after the
prefix and drops the rest, as trimming does for a chain.

Trees need plain KV caches (llama-architecture models, Qwen3, ...): a
recurrent layer holds one state, not one per branch, and a rotating or
quantized cache is not handled. ``check_tree_support`` says which, by name.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import KVCache

from specwire.errors import UnsupportedModelError


def architecture(model: Any) -> str:
    """The model's architecture name as mlx-lm knows it (``llama``, ``qwen3``, ``qwen3_5``, ...)."""
    args = getattr(model, "args", None)
    name = getattr(model, "model_type", None) or getattr(args, "model_type", None)
    return str(name or type(model).__name__)


def check_tree_support(model: Any, cache: Sequence[Any]) -> None:
    """Refuse, naming the architecture, a model whose pass cannot be over a tree."""
    kinds = sorted({type(layer).__name__ for layer in cache if type(layer) is not KVCache})
    if kinds:
        raise UnsupportedModelError(
            f"tree verification needs a plain KV cache in every layer; a {architecture(model)} model "
            f"has {', '.join(kinds)} layers (recurrent or windowed), so it drafts and verifies chains"
        )
    for layer in getattr(model, "layers", None) or [None]:
        attention = getattr(layer, "self_attn", None)
        if attention is None or not isinstance(getattr(attention, "rope", None), nn.Module):
            raise UnsupportedModelError(
                f"tree verification needs attention layers with a rotary embedding (self_attn.rope); "
                f"a {architecture(model)} model's layers have none"
            )


class RopeAtPositions(nn.Module):
    """A layer's rotary embedding, with each of the pass's tokens at a position of its own."""

    def __init__(self, rope: nn.Module, positions: mx.array) -> None:
        super().__init__()
        self.rope = rope
        self.positions = positions

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        # [1, heads, L, dim] -> [L, heads, 1, dim]: each token a batch entry of its own, at its own offset.
        return self.rope(x.transpose(2, 1, 0, 3), offset=self.positions).transpose(2, 1, 0, 3)


@contextmanager
def rope_at(attention: Any, positions: mx.array) -> Iterator[None]:
    """For the length of a pass: ``attention``'s rotary embedding puts each token at ``positions``."""
    rope = attention.rope
    attention.rope = RopeAtPositions(rope, positions)
    try:
        yield
    finally:
        attention.rope = rope


@contextmanager
def placed(model: Any, cache: Sequence[Any], positions: mx.array, mask: mx.array) -> Iterator[None]:
    """For the length of a pass through ``model``'s own call: each token at its own rotary position
    (``positions``), and every layer's attention mask ``mask`` (``forward_at`` says how)."""
    attentions = [layer.self_attn for layer in model.layers]
    ropes = [attention.rope for attention in attentions]
    try:
        for attention, rope in zip(attentions, ropes, strict=True):
            attention.rope = RopeAtPositions(rope, positions)
        for layer in cache:
            layer.make_mask = lambda *args, **kwargs: mask
        yield
    finally:
        for attention, rope in zip(attentions, ropes, strict=True):
            attention.rope = rope
        for layer in cache:
            layer.__dict__.pop("make_mask", None)


def forward_at(
    model: Any, cache: Sequence[Any], tokens: Sequence[int], positions: Sequence[int], visible: np.ndarray
) -> mx.array:
    """Logits [1, L, vocab] of ``tokens`` at ``positions``; token i attends where ``visible[i]`` is true.

    ``visible`` is [L, cached + L]: over the positions the cache holds, then
    over the tokens fed. The cache then holds the L tokens after what it held.
    """
    cached = cache[0].offset
    if visible.shape != (len(tokens), cached + len(tokens)):
        raise ValueError(f"a mask of shape {visible.shape} for {len(tokens)} tokens after {cached} cached")
    with placed(model, cache, mx.array(list(positions)), mx.array(visible)):
        return model(mx.array([list(tokens)]), cache=cache)


def keep_positions(cache: Sequence[Any], start: int, kept: Sequence[int]) -> None:
    """Keep positions ``kept`` (ascending, each at or after ``start``) at ``start`` onwards; drop the rest."""
    moved = list(kept) != list(range(start, start + len(kept)))
    index = mx.array(list(kept))
    for layer in cache:
        if moved:
            layer.keys[..., start : start + len(kept), :] = layer.keys[..., index, :]
            layer.values[..., start : start + len(kept), :] = layer.values[..., index, :]
        layer.offset = start + len(kept)
    if moved:
        mx.eval([array for layer in cache for array in (layer.keys, layer.values)])
