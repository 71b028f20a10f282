"""Filling on the target's machine: the output distribution, and whose drafts are used.

``FilledDraftSource`` takes what a fill-mode worker has ready and drafts the
rest locally. At T > 0 its distribution must be the target's (the
statistical test of pre-speculation, with rounds served whole, in part and
not at all), and the drafts must be the very ones drafting on demand gives,
wherever each was made. The worker's session runs in-process on tiny models
here; through a real worker on the default model, ``test_fill_worker.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.fill import FilledDraftSource
from coordinator.drafting.local import LocalDraftSource
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from tests.coordinator.decoding.test_rejection_sampling import P_VALUE_FLOOR, chi_square_p
from tests.support.models.tiny_models import disagreeing_pair
from tests.support.session_source import SessionSource
from tests.worker.stream.test_prespec import PROMPT, SAMPLED, STAT_RUNS, _exact_joint3


@pytest.fixture(scope="module")
def pair() -> tuple[LoadedModel, LoadedModel]:
    return disagreeing_pair()


def _filled_counts(pair: tuple[LoadedModel, LoadedModel], runs: int) -> tuple[np.ndarray, list[int], int]:
    """Outputs over ``runs`` seeds."""
    target, draft = pair
    counts = np.zeros((target.vocab_size,) * 3)
    filled = 0
    # Eight passes ahead: about half the second rounds find their branch, the rest are drafted here.
    worker = SessionSource(draft, pb.PreSpeculation(enabled=True, fill=True, budget=8, fanout=4))
    source = FilledDraftSource(worker, draft)
    decoder = SpeculativeDecoder(target, source)
    for seed in range(runs):
        params = SamplingParams(seed=seed, **SAMPLED)
        tokens = decoder.generate(PROMPT, max_tokens=3, k=2, params=params).tokens
        counts[tokens[0], tokens[1], tokens[2]] += 1
        filled += source.filled
    return counts, worker.outcomes, filled


def test_filled_output_is_distributed_as_target(pair: tuple[LoadedModel, LoadedModel]) -> None:
    counts, outcomes, filled = _filled_counts(pair, STAT_RUNS)
    assert {pb.SPECULATION_HIT, pb.SPECULATION_MISS} <= set(outcomes) and filled > 0
    assert chi_square_p(counts, _exact_joint3(pair[0], SamplingParams(**SAMPLED))) >= P_VALUE_FLOOR


def test_filled_drafts_are_the_ones_drafting_on_demand_gives(pair: tuple[LoadedModel, LoadedModel]) -> None:
    # The local rest of a block resumes the worker's block (its generator past the worker's draws).
    target, draft = pair
    params = SamplingParams(seed=11, **SAMPLED)
    local = SpeculativeDecoder(target, LocalDraftSource(draft))
    plain = local.generate(PROMPT, max_tokens=24, k=3, params=params)
    worker = SessionSource(draft, pb.PreSpeculation(enabled=True, fill=True, budget=4, fanout=3))
    source = FilledDraftSource(worker, draft)
    filled = SpeculativeDecoder(target, source).generate(PROMPT, max_tokens=24, k=3, params=params)
    assert [r.draft.tokens for r in filled.rounds] == [r.draft.tokens for r in plain.rounds]
    assert filled.tokens == plain.tokens
    kinds = {r.draft.filled for r in filled.rounds}
    assert 0 in kinds and kinds - {0}, f"rounds must be served whole and filled here: {kinds}"
