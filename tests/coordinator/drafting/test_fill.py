"""Filling on the target's machine: losslessness, the output distribution, and whose drafts are used.

``FilledDraftSource`` takes what a fill-mode worker has ready and drafts the
rest locally. At T = 0 the output must be the target's own (through a real
worker on the default model); at T > 0 its distribution must be the
target's (the statistical test of pre-speculation, with rounds served whole,
in part and not at all), and the drafts must be the very ones drafting on
demand gives, wherever each was made.
"""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.fill import FilledDraftSource
from coordinator.drafting.local import LocalDraftSource
from coordinator.drafting.stream import StreamDraftSource
from coordinator.runtime import coordinator_runtime
from coordinator.workers.connection import connect
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from tests.coordinator.decoding.test_rejection_sampling import P_VALUE_FLOOR, chi_square_p
from tests.support.credentials import credentials
from tests.support.models.tiny_models import disagreeing_pair
from tests.support.processes.workers import WorkerProcess
from tests.support.prompts import MAX_TOKENS, PROMPTS, ar_tokens
from tests.support.session_source import SessionSource
from tests.worker.stream.test_prespec import PROMPT, SAMPLED, STAT_RUNS, _exact_joint3

# Three passes ahead (the bonus probe and two of a branch): rounds served whole, in part and not at all.
FILL = pb.PreSpeculation(enabled=True, fill=True, budget=3)


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


@pytest.mark.anyio
async def test_fill_through_a_worker_is_lossless_and_the_worker_counts_its_own_drafts(
    worker: WorkerProcess, default_f32: LoadedModel, default_q4: LoadedModel
) -> None:
    prompts = [default_f32.tokenizer.encode(PROMPTS[1])]
    async with coordinator_runtime() as runtime:
        connection = await connect(worker.address, credentials())
        try:
            for prompt in prompts:
                remote = StreamDraftSource(runtime.portal, connection, default_f32.fingerprint, prespec=FILL)
                source = FilledDraftSource(remote, default_q4)
                decoder = SpeculativeDecoder(default_f32, source)
                result = await runtime.compute.run(
                    decoder.generate, prompt, max_tokens=MAX_TOKENS, k=4, params=SamplingParams()
                )
                assert result.tokens == ar_tokens(default_f32, prompt)
                counters = remote.worker_counters
                asked = [r for r in result.rounds if r.draft.calls]
                assert counters.rounds == len(asked)
                assert counters.draft_tokens == sum(r.drafted - r.draft.filled for r in asked)
                served = [r.draft.speculation for r in asked[1:]]
                assert counters.prespec_hits == served.count("hit")
                assert counters.prespec_misses == served.count("miss")
                assert source.filled == sum(r.draft.filled for r in result.rounds) > 0
                assert counters.prespec_hits + counters.prespec_partial > 0
                print(
                    f"hits {served.count('hit')}, partial {served.count('partial')}, misses "
                    f"{served.count('miss')}; {source.filled} of {result.drafted} drafts filled here"
                )
        finally:
            await connection.close()
