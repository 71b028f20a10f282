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

import mlx.core as mx
import numpy as np

from specwire.drafting.sampling import SparseDistribution

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
    """``top_choices`` with NumPy: ``width`` argmaxes a row, each masking the one before."""
    logits = np.array(rows.astype(mx.float32), copy=True)
    batch, vocab = logits.shape
    width = min(width, vocab)
    every = np.arange(batch)
    top = logits.max(axis=-1, keepdims=True)
    log_total = np.log(np.exp(logits - top).sum(axis=-1))
    ids = np.empty((batch, width), np.int32)
    values = np.empty((batch, width), np.float32)
    for j in range(width):
        best = logits.argmax(axis=-1)  # the first of equal maxima: the lower id
        ids[:, j] = best
        values[:, j] = logits[every, best]
        logits[every, best] = -np.inf
    probs = np.exp(values - top - log_total[:, None]).astype(np.float32)
    return ids, probs


def likeliest(rows: np.ndarray, width: int) -> list[SparseDistribution]:
    """Each processed logits row's ``width`` likeliest tokens, most probable first (lower id first among
    equals, as ``argmax``), and their probabilities over the whole row; tokens a row masks (-inf) are
    never among them, and a row that masks every token has none. ``width`` argmaxes over all rows at
    once, each masking the one before, and one exponential in float32 (a processed row is NumPy)."""
    values = np.array(rows, dtype=np.float32).reshape(-1, rows.shape[-1])
    batch, vocab = values.shape
    top = values.max(axis=-1, keepdims=True)
    top[~np.isfinite(top)] = 0.0  # a row with nothing allowed: its choices are all -inf, left out below
    log_total = np.log(np.exp(values - top).sum(axis=-1, keepdims=True))
    every = np.arange(batch)
    ids = np.empty((batch, min(width, vocab)), np.int64)
    chosen = np.empty(ids.shape, np.float32)
    for j in range(ids.shape[1]):
        best = values.argmax(axis=-1)
        ids[:, j], chosen[:, j] = best, values[every, best]
        values[every, best] = -np.inf
    probs = np.exp(chosen - top - log_total).astype(np.float64)
    kept = np.isfinite(chosen)
    return [SparseDistribution(i[k], p[k]) for i, p, k in zip(ids, probs, kept, strict=True)]
