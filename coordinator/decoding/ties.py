"""Where SD may part from AR at T = 0 on a GPU: a tie of the target's two best logits, within rounding.

Verification takes each token's argmax from a pass over k + 1 positions,
AR from a pass over one. On MLX's CPU backend the two give the same logits
bit for bit, so SD's output is AR's exactly. On a GPU they round apart (an
H100 measured up to 0.034 in the default target's logits), so the outputs
can part only where the target's two best logits lie within that rounding:
either token is then the target's greedy choice, up to rounding. ``tie_at``
says whether a divergence is such a tie, measuring this backend's rounding
where it happened, and that the token SD chose is within it of AR's;
anything else is a real mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from specwire.models.loading import LoadedModel

TIE_FACTOR = 2.0  # a gap up to twice the measured rounding counts as a tie


@dataclass(frozen=True)
class Tie:
    """A divergence at ``token`` where the top-2 gap is within the rounding measured there."""

    token: int
    gap: float
    rounding: float

    def __str__(self) -> str:
        return (
            f"parts from AR at token {self.token}, a tie: top-2 gap {self.gap:.2e}, "
            f"rounding {self.rounding:.2e}"
        )


def rounding_gap(model: LoadedModel, tokens: list[int], positions: int = 5) -> float:
    """The largest logit difference over the last ``positions`` tokens: one position per pass (as AR
    computes them) against all of them in one pass after the same cache (as verification does).

    Two caches, each built one position at a time, so any model works (recurrent layers included).
    """
    single, batched_cache = make_prompt_cache(model.model), make_prompt_cache(model.model)
    rows = []
    for i, t in enumerate(tokens):
        rows.append(np.array(model.model(mx.array([[t]]), cache=single)[0, -1].astype(mx.float32)))
        if i < len(tokens) - positions:
            model.model(mx.array([[t]]), cache=batched_cache)
    batched = model.model(mx.array([tokens[-positions:]]), cache=batched_cache)[0].astype(mx.float32)
    return float(np.abs(np.stack(rows[-positions:]) - np.array(batched)).max())


def _logits(target: LoadedModel, context: list[int]) -> np.ndarray:
    return np.array(target.model(mx.array([context]))[0, -1].astype(mx.float32))


def top2_gap(target: LoadedModel, context: list[int]) -> float:
    """Distance between the target's two largest logits after ``context``."""
    second, first = np.sort(_logits(target, context))[-2:]
    return float(first - second)


def logit_gap(target: LoadedModel, context: list[int], chosen: int, other: int) -> float:
    """How far the target's logit of ``other`` lies below that of ``chosen`` after ``context``."""
    logits = _logits(target, context)
    return float(logits[chosen] - logits[other])


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, or of the end of the shorter list; None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def measure_tie(target: LoadedModel, prompt: list[int], ar: list[int], at: int, other: int | None) -> Tie:
    """Where SD parted from AR at token ``at`` with token ``other``: how far its logit lies below AR's
    choice (the top-2 gap when ``other`` is unknown, as when SD stopped), and the rounding there."""
    context = prompt + ar[: at + 1]
    before = prompt + ar[:at]
    gap = top2_gap(target, before) if other is None else logit_gap(target, before, ar[at], other)
    return Tie(at, gap, rounding_gap(target, context, min(5, len(context))))


def tie_at(target: LoadedModel, prompt: list[int], ar: list[int], sd: list[int]) -> Tie | None:
    """The tie where ``sd`` first parts from ``ar``, or None when it does not or not at a tie.

    Runs the target (compute thread); call only for outputs that differ.
    """
    at = first_divergence(ar, sd)
    if at is None or at >= len(ar) or at >= len(sd):
        return None  # equal, or one stopped early: not a choice between two tokens
    tie = measure_tie(target, prompt, ar, at, sd[at])
    return tie if tie.gap <= TIE_FACTOR * tie.rounding else None
