"""How far a backend's batched passes round from single-position passes, and SD checked against AR with it.

At T = 0 speculative decoding takes each token's argmax from a verification
pass over k + 1 positions, where AR takes it from a pass over one. On MLX's
CPU backend the two give the same logits bit for bit; on a GPU they round
apart, so SD and AR can part only where the target's two best logits lie
within that rounding: a tie (``assert_lossless``).
"""

from __future__ import annotations

import warnings

from coordinator.decoding.results import GenerationResult
from coordinator.decoding.ties import TIE_FACTOR, first_divergence, measure_tie, rounding_gap, top2_gap
from specwire.models import LoadedModel

__all__ = ["assert_lossless", "assert_rejections_are_ties", "first_divergence", "rounding_gap", "top2_gap"]


def assert_lossless(target: LoadedModel, prompt: list[int], ar: list[int], sd: list[int]) -> None:
    """SD equals AR, or differs first where its token's logit is within this backend's rounding of AR's."""
    at = first_divergence(ar, sd)
    if at is None:
        return
    tie = measure_tie(target, prompt, ar, at, sd[at] if at < min(len(ar), len(sd)) else None)
    gap, rounding = tie.gap, tie.rounding
    assert gap <= TIE_FACTOR * rounding, (
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
            assert gap <= TIE_FACTOR * rounding, (
                f"a draft of the target itself was rejected after {emitted + r.accepted} tokens, where its "
                f"top-2 gap is {gap:.3g} and batched and single passes round apart by {rounding:.3g}"
            )
        emitted += len(r.tokens)
