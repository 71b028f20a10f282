"""At T = 0, speculative decoding emits the target's greedy tokens through every rejection path.

The real default pair accepts nearly every draft (``test_lossless.py``), so
a correction after 0..k-1 accepted drafts is covered here, at every k, on
tiny random models whose greedy choices often differ, where a run costs
milliseconds.
"""

from __future__ import annotations

import pytest

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.local import LocalDraftSource
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from tests.support.models.tiny_models import disagreeing_pair
from tests.support.prompts import ar_tokens


@pytest.fixture(scope="module")
def disagreeing() -> tuple[LoadedModel, LoadedModel]:
    """Tiny random models whose greedy choices often differ (every rejection path is taken)."""
    return disagreeing_pair()


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_sd_equals_ar_through_every_rejection_path(
    disagreeing: tuple[LoadedModel, LoadedModel], k: int
) -> None:
    target, draft = disagreeing
    decoder = SpeculativeDecoder(target, LocalDraftSource(draft))
    accepted_counts: set[int] = set()
    for seed in range(12):
        prompt = [(seed * 7 + 3 * i) % 8 for i in range(1 + seed % 4)]
        result = decoder.generate(prompt, max_tokens=24, k=k, params=SamplingParams())
        assert result.tokens == ar_tokens(target, prompt, 24)
        accepted_counts |= {r.accepted for r in result.rounds if r.drafted == k}
    # A first-draft rejection and full acceptance occurred; up to k = 4, every count in between too.
    assert {0, k} <= accepted_counts and (k > 4 or accepted_counts == set(range(k + 1))), accepted_counts
