"""Filling on the target's machine through a real worker on the default model: lossless at T = 0.

``FilledDraftSource`` takes what a fill-mode worker has ready and drafts the
rest locally; the output must be the target's own, and the worker's counters
must count only the drafts it made. The output's distribution at T > 0 is
checked in ``test_fill.py``.
"""

from __future__ import annotations

import pytest

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.fill import FilledDraftSource
from coordinator.drafting.stream import StreamDraftSource
from coordinator.runtime import coordinator_runtime
from coordinator.workers.connection import connect
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from tests.support.credentials import credentials
from tests.support.processes.workers import WorkerProcess
from tests.support.prompts import MAX_TOKENS, PROMPTS, ar_tokens

# Three passes ahead (the bonus probe and two of a branch): rounds served whole, in part and not at all.
FILL = pb.PreSpeculation(enabled=True, fill=True, budget=3)


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
