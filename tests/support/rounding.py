"""How far a backend's batched passes round from single-position passes, and SD checked against AR with it.

At T = 0 speculative decoding takes each token's argmax from a verification
pass over k + 1 positions, where AR takes it from a pass over one. On MLX's
CPU backend the two give the same logits bit for bit; on a GPU they round
apart, so SD and AR can part only where the target's two best logits lie
within that rounding: a tie (``assert_lossless``). Where a test compares
two computations of the same values (a tree pass and a chain pass, say),
``backend_rounding`` measures how far this backend's passes round apart, and
``assert_logits_within`` and ``assert_caches_within`` allow no more: nothing
on the CPU, where they must agree bit for bit.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from coordinator.decoding.results import GenerationResult
from coordinator.decoding.ties import TIE_FACTOR, first_divergence, measure_tie, rounding_gap, top2_gap
from specwire.models.loading import LoadedModel

__all__ = [
    "EXACT",
    "PassRounding",
    "assert_caches_within",
    "assert_logits_within",
    "assert_lossless",
    "assert_rejections_are_ties",
    "backend_rounding",
    "cache_arrays",
    "first_divergence",
    "pass_rounding",
    "rounding_gap",
    "top2_gap",
]


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


@dataclass(frozen=True)
class PassRounding:
    """How far one pass over several positions rounds from passes of one position each, on this backend."""

    logits: float  # the largest difference of a logit
    cache: float  # the largest difference in a cache array, over that array's largest magnitude


EXACT = PassRounding(0.0, 0.0)


def cache_arrays(layer: object) -> list[mx.array]:
    """A layer cache's arrays: keys and values held, or a recurrent layer's window and state."""
    kv = getattr(layer, "keys_and_values", None)
    return list(kv()) if kv is not None else list(layer.cache)  # type: ignore[attr-defined]


def _host(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32))


def relative_difference(got: mx.array, want: mx.array) -> float:
    """The largest element difference of two arrays over ``want``'s largest magnitude (alone where 0)."""
    a, b = _host(got), _host(want)
    assert a.shape == b.shape, f"shapes {a.shape} and {b.shape}"
    difference, scale = float(np.abs(a - b).max(initial=0.0)), float(np.abs(b).max(initial=0.0))
    return difference / scale if scale else difference


def pass_rounding(model: LoadedModel, tokens: list[int], positions: int) -> PassRounding:
    """How one pass over the last ``positions`` of ``tokens`` rounds from one position per pass, after
    the same cache: in the logits, and in every layer's cache after them.

    Both caches are built one position at a time up to the pass, so any model works (recurrent layers
    included). It measures the backend, not the code under test: no tree, no rollback.
    """
    single, batched = make_prompt_cache(model.model), make_prompt_cache(model.model)
    rows = []
    for i, t in enumerate(tokens):
        rows.append(model.model(mx.array([[t]]), cache=single)[0, -1])
        if i < len(tokens) - positions:
            model.model(mx.array([[t]]), cache=batched)
    logits = model.model(mx.array([tokens[-positions:]]), cache=batched)[0]
    cache = max(
        relative_difference(a, b)
        for x, y in zip(batched, single, strict=True)
        for a, b in zip(cache_arrays(x), cache_arrays(y), strict=True)
    )
    return PassRounding(float(np.abs(_host(logits) - _host(mx.stack(rows[-positions:]))).max()), cache)


def backend_rounding(model: LoadedModel, passes: Iterable[tuple[list[int], int]]) -> PassRounding:
    """``EXACT`` on the CPU, whose batched and single passes agree bit for bit; on a GPU the largest
    ``pass_rounding`` over ``passes`` (tokens, and how many of the last go in one pass)."""
    if mx.default_device() == mx.cpu:
        return EXACT
    measured = [pass_rounding(model, tokens, positions) for tokens, positions in passes]
    return PassRounding(max(m.logits for m in measured), max(m.cache for m in measured))


def assert_logits_within(got: mx.array, want: mx.array, rounding: PassRounding, what: str) -> None:
    """The same logits bit for bit where ``rounding`` is ``EXACT``; else no further apart than
    ``TIE_FACTOR`` times the rounding measured (each of two passes may round that far from a third)."""
    a, b = _host(got), _host(want)
    if rounding == EXACT:
        assert np.array_equal(a, b), f"{what}: not bit for bit"
        return
    difference = float(np.abs(a - b).max())
    assert difference <= TIE_FACTOR * rounding.logits, (
        f"{what} differ by {difference:.3g}, where this backend's passes round apart by {rounding.logits:.3g}"
    )


def assert_caches_within(got: Sequence[object], want: Sequence[object], rounding: PassRounding) -> None:
    """Every layer's cache arrays the same bit for bit where ``rounding`` is ``EXACT``; else each no
    further apart, relative to its largest magnitude, than ``TIE_FACTOR`` times the rounding measured."""
    for layer, (x, y) in enumerate(zip(got, want, strict=True)):
        for i, (a, b) in enumerate(zip(cache_arrays(x), cache_arrays(y), strict=True)):
            if rounding == EXACT:
                assert np.array_equal(_host(a), _host(b)), f"layer {layer}, array {i}: not bit for bit"
                continue
            difference = relative_difference(a, b)
            assert difference <= TIE_FACTOR * rounding.cache, (
                f"layer {layer}, array {i} differs by {difference:.3g} of its magnitude, where this "
                f"backend's passes round apart by {rounding.cache:.3g}"
            )
