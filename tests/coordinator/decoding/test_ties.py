"""A divergence from AR is excused only at a tie of the target's logits within the backend's rounding.

On the CPU batched and single passes round alike, so only an exact tie is
excused: a target whose embedding (tied to its output layer) holds two equal
rows scores those two tokens equally everywhere, and an output that picks
the other one where AR picked the first is a tie; any other divergence is not.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.decoding.ties import tie_at
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from tests.support.models.tiny_models import as_loaded, tiny_llama

PROMPT = [2, 5, 1]


@pytest.fixture(scope="module")
def twins() -> tuple[LoadedModel, list[int], int]:
    """A tiny target, its greedy output, and a token whose logit always equals that output's first."""
    model, args = tiny_llama(0)
    assert args.get("tie_word_embeddings", True), "the twin rows must reach the output layer"
    ar = (
        SpeculativeDecoder(as_loaded(model, args, "t"))
        .generate(PROMPT, max_tokens=6, k=0, params=SamplingParams())
        .tokens
    )
    weight = model.model.embed_tokens.weight
    twin = next(t for t in range(weight.shape[0]) if t not in ar and t not in PROMPT)
    model.model.embed_tokens.weight = mx.concatenate(
        [weight[:twin], weight[ar[0] : ar[0] + 1], weight[twin + 1 :]]
    )
    target = as_loaded(model, args, "twins")
    tied = SpeculativeDecoder(target).generate(PROMPT, max_tokens=6, k=0, params=SamplingParams()).tokens
    assert tied[0] in (ar[0], twin)
    return target, tied, ar[0] if tied[0] == twin else twin  # AR's output and the token tied with its first


def test_the_other_of_two_tied_tokens_is_excused(twins: tuple[LoadedModel, list[int], int]) -> None:
    target, ar, twin = twins
    tie = tie_at(target, PROMPT, ar, [twin, *ar[1:]])
    assert tie is not None and tie.token == 0 and tie.gap == 0.0
    assert "a tie" in str(tie)


def test_any_other_divergence_is_not(twins: tuple[LoadedModel, list[int], int]) -> None:
    target, ar, twin = twins
    other = next(t for t in range(target.args["vocab_size"]) if t not in (ar[0], twin))  # a worse token
    assert tie_at(target, PROMPT, ar, [other, *ar[1:]]) is None
    assert tie_at(target, PROMPT, ar, list(ar)) is None
    assert tie_at(target, PROMPT, ar, ar[:3]) is None  # stopped early: not a choice between two tokens
