"""A draft's likeliest next tokens and their probabilities, computed where the model runs.

Pre-speculation ranks what to draft by these: the branches after a
rejection, the nodes of a tree. Only a few tokens and values come back to
the host.
"""

from __future__ import annotations

import mlx.core as mx

BLOCK = 64  # logits per block when looking for a row's likeliest tokens
SPANS = 8  # blocks kept a row: they hold its likeliest tokens and normalise their probabilities


def top_choices(rows: mx.array, width: int) -> tuple[mx.array, mx.array]:
    """Each row's ``width`` likeliest tokens, most probable first (lazy), and their probabilities.

    A row's logits are cut into blocks of ``BLOCK``; the ``SPANS`` blocks
    with the largest maxima hold its likeliest tokens (among equal logits
    the lower id comes first, as with ``argmax``). The probabilities only
    rank nodes, so they are normalised over those blocks' logits, not the
    whole vocabulary: the tail's mass is left out, which a peaked draft
    distribution barely has, and an exponential (or a top-k) over every
    logit of every row costs more than the rest of a pass on a CPU.
    """
    batch, vocab = rows.shape
    width = min(width, vocab)
    pad = -vocab % BLOCK
    tail = mx.full((batch, pad), -mx.inf, dtype=rows.dtype)
    blocks = (mx.concatenate([rows, tail], axis=-1) if pad else rows).reshape(batch, -1, BLOCK)
    spans = min(max(width, SPANS), blocks.shape[1])
    chosen = mx.sort(mx.argpartition(-mx.max(blocks, axis=-1), spans - 1, axis=-1)[:, :spans], axis=-1)
    values = mx.take_along_axis(blocks, chosen[:, :, None], axis=1).reshape(batch, -1)
    ids = (chosen[:, :, None] * BLOCK + mx.arange(BLOCK)[None, None, :]).reshape(batch, -1)
    order = mx.argsort(-values, axis=-1)[:, :width]
    probs = mx.exp(mx.take_along_axis(values, order, axis=-1) - mx.logsumexp(values, axis=-1, keepdims=True))
    return mx.take_along_axis(ids, order, axis=-1), probs
