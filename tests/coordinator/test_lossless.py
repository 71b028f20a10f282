"""At T = 0, speculative decoding emits exactly the target's greedy tokens.

Real default model, six completion prompts (code, math, prose), k in
{1, 2, 4, 8}, with the default pair (float32 target, Q4_1 draft) and with an
identical pair (Q4_1 drafting for itself). A divergence is excused only where
the target's two best logits lie within 1e-4 of each other (batched and
single-token passes may round differently there); anything else fails.
"""

from __future__ import annotations

import warnings

import mlx.core as mx
import pytest

from coordinator.drafting.local import LocalDraftSource
from coordinator.engine import SpeculativeDecoder
from specwire.models import LoadedModel
from specwire.sampling import SamplingParams
from tests.support.prompts import MAX_TOKENS, PROMPTS, ar_tokens

TIE_TOLERANCE = 1e-4
PAIRS = {
    "f32-target/q4-draft": ("default_f32", "default_q4"),
    "identical-q4": ("default_q4", "default_q4"),
}


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
    """SD equals AR, or differs first at a near-tie of the target's logits."""
    at = first_divergence(ar, sd)
    if at is None:
        return
    gap = top2_gap(target, prompt + ar[:at])
    assert gap < TIE_TOLERANCE, f"SD diverged from AR at token {at} where the target's top-2 gap is {gap:.3g}"
    warnings.warn(f"excused divergence at token {at}: top-2 logit gap {gap:.2e}", stacklevel=2)


@pytest.fixture(scope="module", params=list(PAIRS))
def pair(request: pytest.FixtureRequest) -> tuple[str, LoadedModel, LoadedModel]:
    target_name, draft_name = PAIRS[request.param]
    return request.param, request.getfixturevalue(target_name), request.getfixturevalue(draft_name)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_sd_equals_ar_on_every_prompt(pair: tuple[str, LoadedModel, LoadedModel], k: int) -> None:
    _, target, draft = pair
    decoder = SpeculativeDecoder(target, LocalDraftSource(draft))
    drafted = 0
    for text in PROMPTS:
        prompt = target.tokenizer.encode(text)
        result = decoder.generate(prompt, max_tokens=MAX_TOKENS, k=k, params=SamplingParams())
        assert_lossless(target, prompt, ar_tokens(target, prompt), result.tokens)
        assert all(r.drafted <= k for r in result.rounds)
        drafted += result.drafted
    assert drafted > 0  # the drafts really went through verification


def test_identical_pair_accepts_every_draft(default_q4: LoadedModel) -> None:
    # The same model drafting for itself must agree with itself at every
    # position: batched verification reproduces single-token drafting here.
    prompt = default_q4.tokenizer.encode(PROMPTS[0])
    result = SpeculativeDecoder(default_q4, LocalDraftSource(default_q4)).generate(
        prompt, max_tokens=MAX_TOKENS, k=4, params=SamplingParams()
    )
    assert result.acceptance_rate == 1.0
