"""A draft's likeliest next tokens and their probabilities, computed where the model runs.

Pre-speculation ranks what to draft by these: the branches after a
rejection, the nodes of a tree. Only a few tokens and values come back to
the host.

On a GPU they are computed on the device, and only ``width`` ids and values
a row leave it. On MLX's CPU backend the logits already lie in host memory
and NumPy's reductions run about 20 times faster than MLX's there (a 64-row
argmax over 2,048 logits: 0.01 ms against 0.23, this project's 2-core
machine), so the rows are ranked with NumPy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from specwire.drafting.sampling import SparseDistribution

if TYPE_CHECKING:
    from specwire.logits.processors import Processing

BLOCK = 64  # logits per block when looking for a row's likeliest tokens
SPANS = 8  # blocks kept a row: they hold its likeliest tokens and normalise their probabilities


def top_choices(rows: mx.array, width: int) -> tuple[mx.array, mx.array]:
    """Each row's ``width`` likeliest tokens, most probable first, and their probabilities.

    Among equal logits the lower id comes first, as with ``argmax``. On a
    GPU (lazy arrays): a row's logits are cut into blocks of ``BLOCK``; the
    ``SPANS`` blocks with the largest maxima hold its likeliest tokens, and
    the probabilities, which only rank nodes, are normalised over those
    blocks' logits, not the whole vocabulary (the tail's mass, which a peaked
    draft distribution barely has, is left out: an exponential over every
    logit of every row costs more than the rest of a pass). On the CPU
    (computed now): ranked with NumPy and normalised over the whole row.
    """
    if mx.default_device() == mx.cpu:
        host_ids, host_probs = _ranked_with_numpy(rows, width)
        return mx.array(host_ids), mx.array(host_probs)
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


def top_choices_now(rows: mx.array, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``top_choices``, computed now, as NumPy arrays (ids, and probabilities in float64)."""
    if mx.default_device() == mx.cpu:
        ids, probs = _ranked_with_numpy(rows, width)
    else:
        lazy = top_choices(rows.astype(mx.float32), width)
        mx.eval(*lazy)
        ids, probs = np.array(lazy[0]), np.array(lazy[1])
    return ids, probs.astype(np.float64)


def _ranked_with_numpy(rows: mx.array, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``top_choices`` with NumPy (``ranked``)."""
    return ranked(np.array(rows.astype(mx.float32), copy=True), width)


def ranked(logits: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``width`` likeliest tokens and their probabilities over the whole row: ``width``
    argmaxes a row (the first of equal maxima: the lower id), each masking the one before, and one
    exponential. ``logits`` (float32, a row each) is used up. A token a row masks (-inf) gets
    probability 0, and a row that masks every token gets 0 throughout."""
    batch, vocab = logits.shape
    width = min(width, vocab)
    every = np.arange(batch)
    top = logits.max(axis=-1, keepdims=True)
    top[~np.isfinite(top)] = 0.0  # a row with nothing allowed: all its probabilities are 0
    total = np.exp(logits - top).sum(axis=-1, keepdims=True)
    ids = np.empty((batch, width), np.int32)
    values = np.empty((batch, width), np.float32)
    for j in range(width):
        best = logits.argmax(axis=-1)
        ids[:, j] = best
        values[:, j] = logits[every, best]
        logits[every, best] = -np.inf
    probs = np.exp(values - top) / np.maximum(total, np.finfo(np.float32).tiny)
    return ids, probs.astype(np.float32)


def likeliest(rows: np.ndarray, width: int) -> list[SparseDistribution]:
    """Each processed logits row's (NumPy, -inf where masked) ``width`` likeliest tokens, most probable
    first, and their probabilities over the whole row; masked tokens are never among them."""
    ids, probs = ranked(np.array(rows, dtype=np.float32).reshape(-1, rows.shape[-1]), width)
    kept = probs > 0
    return [
        SparseDistribution(i[k].astype(np.int64), p[k].astype(np.float64))
        for i, p, k in zip(ids, probs, kept, strict=True)
    ]


def processed_choices(
    rows: mx.array,
    suffixes: Sequence[Sequence[int]],
    processing: Processing,
    width: int,
    inverse_temperature: float = 1.0,
) -> tuple[list[list[int]], list[list[float]]]:
    """Each row's likeliest next tokens (ids and probabilities, most probable first) under a request's
    penalties and grammar, the row read after ``suffixes[i]`` (its chain or tree path past the accepted
    output), as the target's verdict will process it; none where the grammar allows nothing. Both act
    where the logits are: the bias and penalties on the ids they name (``Processing.penalised``), the
    grammar as a mask; the rows are then ranked as unprocessed rows are (``top_choices``)."""
    rows = processing.penalised(rows, suffixes)
    masks = processing.masks(suffixes, rows.shape[-1])
    ids_of: list[list[int]] = [[] for _ in suffixes]
    probs_of: list[list[float]] = [[] for _ in suffixes]
    alive = np.arange(len(suffixes)) if masks is None else np.flatnonzero(masks.any(axis=1))
    if alive.size:
        picked = rows[mx.array(alive)].astype(mx.float32)
        if masks is not None:
            picked = mx.where(mx.array(masks[alive]), picked, -mx.inf)
        ids, probs = top_choices_now(picked * inverse_temperature, width)
        for row, i, p in zip(alive.tolist(), ids, probs, strict=True):
            kept = p > 0  # a masked token's probability is 0
            ids_of[row], probs_of[row] = i[kept].tolist(), p[kept].tolist()
    return ids_of, probs_of
