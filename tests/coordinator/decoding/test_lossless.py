"""At T = 0, speculative decoding emits exactly the target's greedy tokens.

What guarantees it: at each position, verification takes the argmax of the
target's logits from a pass over k + 1 positions, where AR takes it from a
pass over one. Both run the same model on the same tokens; only the order of
floating-point operations may differ. On MLX's CPU backend it does not: a
batched pass's rows equal single-position passes bit for bit (checked here),
so SD's output is AR's exactly. On a GPU the rows round differently (an H100
measured up to 0.034 in the default target's logits), so the two outputs can
part only at a position where the target's two best logits lie within that
rounding of each other: a tie, where either token is the target's greedy
choice up to rounding.

Real default model: the default pair (float32 target, Q4_1 draft) at the
default k = 4 on three completion prompts (code, math, prose) and at
k = 1 and 8 on one more each (k = 2 and 3 differ from these only in where
a round ends, which the tiny pair covers at every k); an identical pair
(Q4_1 drafting for itself) at k = 8 accepts every draft and equals the
Q4_1 model's AR.
A divergence is excused only where the target's top-2 gap is within twice
the rounding this backend shows there (zero on the CPU); anything else fails.

The real pair accepts nearly every draft, so the rejection paths (a
correction after 0..k-1 accepted drafts, every k) are covered on tiny
random models that disagree often, where a run costs milliseconds
(``test_rejection_paths.py``, in a file of its own so that it runs beside
the default model's files rather than after them).
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.local import LocalDraftSource
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from tests.support.prompts import MAX_TOKENS, PROMPTS, ar_tokens, local_sd
from tests.support.rounding import assert_lossless, rounding_gap

PAIRS = {"f32-target/q4-draft": ("default_f32", "default_q4")}


def test_batched_and_single_position_passes_round_alike_on_the_cpu(default_f32: LoadedModel) -> None:
    # The guarantee above rests on this: zero on the CPU; on a GPU, rounding far below the logits' scale.
    tokens = default_f32.tokenizer.encode(PROMPTS[2])
    rounding = rounding_gap(default_f32, tokens)
    if mx.default_device() == mx.cpu:
        assert rounding == 0.0
    else:
        scale = float(mx.abs(default_f32.model(mx.array([tokens]))).max().item())
        assert rounding < 1e-2 * scale, (
            f"batched and single passes differ by {rounding} (logits up to {scale})"
        )


CASES = [
    ("f32-target/q4-draft", 4, PROMPTS[::2]),  # code, math, prose; k = 1 and 8 take two more
    ("f32-target/q4-draft", 1, PROMPTS[1:2]),
    ("f32-target/q4-draft", 8, PROMPTS[5:]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("pair", "k", "texts"), CASES, ids=[f"{p}-k{k}" for p, k, _ in CASES])
def test_sd_equals_ar_on_every_prompt(
    request: pytest.FixtureRequest, pair: str, k: int, texts: list[str]
) -> None:
    target, draft = (request.getfixturevalue(name) for name in PAIRS[pair])
    drafted = 0
    for text in texts:
        prompt = target.tokenizer.encode(text)
        result = local_sd(target, draft, prompt, k)
        assert_lossless(target, prompt, ar_tokens(target, prompt), result.tokens)
        assert all(r.drafted <= k for r in result.rounds)
        drafted += result.drafted
    assert drafted > 0  # the drafts really went through verification


@pytest.mark.parametrize("k", [8])  # the widest batched verification (k = 1: test_rejection_paths.py)
def test_identical_pair_accepts_every_draft_and_equals_ar(default_q4: LoadedModel, k: int) -> None:
    # The same model drafting for itself must agree with itself at every
    # position: batched verification reproduces single-token drafting here.
    prompt = default_q4.tokenizer.encode(PROMPTS[2 - k % 2])
    result = SpeculativeDecoder(default_q4, LocalDraftSource(default_q4)).generate(
        prompt, max_tokens=MAX_TOKENS, k=k, params=SamplingParams()
    )
    assert result.acceptance_rate == 1.0
    assert result.tokens == ar_tokens(default_q4, prompt)
