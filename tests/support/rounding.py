"""How far a backend's batched passes round from single-position passes, and SD checked against AR with it.

At T = 0 speculative decoding takes each token's argmax from a verification
pass over k + 1 positions, where AR takes it from a pass over one. On MLX's
CPU backend the two give the same logits bit for bit; on a GPU they round
apart, so SD and AR can part only where the target's two best logits lie
within that rounding: a tie (``assert_lossless``).
"""

from __future__ import annotations

import warnings

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from coordinator.decoding.results import GenerationResult
from specwire.models import LoadedModel


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


def top2_gap(target: LoadedModel, context: list[int]) -> float:
    """Distance between the target's two largest logits after ``context``."""
    logits = target.model(mx.array([context]))[0, -1].astype(mx.float32)
    top = mx.sort(logits)[-2:].tolist()
    return float(top[1] - top[0])


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, or of the end of the shorter list; None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_lossless(target: LoadedModel, prompt: list[int], ar: list[int], sd: list[int]) -> None:
    """SD equals AR, or differs first at a tie of the target's logits within this backend's rounding."""
    at = first_divergence(ar, sd)
    if at is None:
        return
    context = prompt + ar[: at + 1]
    gap, rounding = top2_gap(target, prompt + ar[:at]), rounding_gap(target, context, min(5, len(context)))
    assert gap <= 2 * rounding, (
        f"SD diverged from AR at token {at}, where the target's top-2 gap is {gap:.3g} and batched and "
        f"single passes round apart by {rounding:.3g}"
    )
    warnings.warn(
        f"excused divergence at token {at}: top-2 gap {gap:.2e}, rounding {rounding:.2e}", stacklevel=2
    )


def assert_rejections_are_ties(target: LoadedModel, prompt: list[int], result: GenerationResult) -> None:
    """A model drafting for itself: every draft is accepted, but where its two best logits tie within
    this backend's rounding (none on the CPU, whose batched and single passes agree bit for bit)."""
    emitted = 0
    for r in result.rounds:
        if r.accepted < r.drafted:
            context = prompt + result.tokens[: emitted + r.accepted]
            gap = top2_gap(target, context)
            rounding = rounding_gap(target, [*context, r.draft.tokens[r.accepted]], min(5, len(context) + 1))
            assert gap <= 2 * rounding, (
                f"a draft of the target itself was rejected after {emitted + r.accepted} tokens, where its "
                f"top-2 gap is {gap:.3g} and batched and single passes round apart by {rounding:.3g}"
            )
        emitted += len(r.tokens)
