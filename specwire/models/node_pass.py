"""A hybrid model's pass over nodes of a tree, each continuing its own parent's path.

A worker's tree (``specwire.drafting.ahead.draft_tree``) expands a batch of nodes a
pass, each the next token after its parent's path. With a plain KV cache
that is tree attention (``specwire.models.tree_pass``): one sequence, a mask
saying which kept positions each node sees. A Gated DeltaNet layer
(Qwen3.5) has no positions to mask: each node continues its parent's
convolution window and recurrent state. So this pass runs mlx-lm's own
``qwen3_5`` layers in their order with the hidden states laid out for each:

* a Gated DeltaNet layer takes the nodes as the rows of one batch
  ([nodes, 1, width]), its ``ArraysCache`` holding every parent's window and
  state as those rows: mlx-lm's batched decoding step, its fused paths
  included;
* a full-attention layer takes them as one sequence ([1, nodes, width]) over
  the tree's KV cache, each node at its own rotary position and seeing only
  what ``visible`` allows.

Every other operation works position by position, so the two layouts meet
with a reshape. Each node's window and state after it come back as the rows
of each layer's batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache

from specwire.models.tree_pass import rope_at

LayerRows = tuple[mx.array, mx.array]  # a Gated DeltaNet layer's windows and states, a row per node


def forward_nodes_keeping_states(
    model: Any,
    cache: Sequence[Any],
    tokens: Sequence[int],
    positions: Sequence[int],
    visible: np.ndarray,
    starts: dict[int, LayerRows],
) -> tuple[mx.array, dict[int, LayerRows]]:
    """Logits [1, L, vocab] of ``tokens``, token i at rotary position ``positions[i]``: attention layers
    over their ``cache`` layer (which then holds the L tokens after what it held), token i seeing where
    ``visible[i]`` ([L, cached + L]) is true; each Gated DeltaNet layer ``j`` from ``starts[j]``, a row
    per token. Returns the logits and every such layer's rows after the tokens."""
    language = model.language_model
    text = language.model
    length = len(tokens)
    hidden = text.embed_tokens(mx.array([list(tokens)]))
    mask = mx.array(visible)
    at = mx.array(list(positions))
    after: dict[int, LayerRows] = {}
    for i, (layer, layer_cache) in enumerate(zip(text.layers, cache, strict=True)):
        if layer.is_linear:
            rows = ArraysCache(2)
            rows[0], rows[1] = starts[i]
            hidden = layer(hidden.reshape(length, 1, -1), None, rows).reshape(1, length, -1)
            after[i] = (rows[0], rows[1])
            continue
        with rope_at(layer.self_attn, at):
            hidden = layer(hidden, mask, layer_cache)
    out = text.norm(hidden)
    if language.args.tie_word_embeddings:
        return text.embed_tokens.as_linear(out), after
    return language.lm_head(out), after


def stacked(rows: Sequence[LayerRows]) -> LayerRows:
    """One Gated DeltaNet layer's (window, state) of each of several nodes, as the rows of one batch."""
    if len(rows) == 1:
        return rows[0]
    return mx.concatenate([w for w, _ in rows]), mx.concatenate([s for _, s in rows])
