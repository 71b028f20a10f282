"""Pre-speculation through a real worker of the default model: the output is the target's at T = 0.

The branches' equality with drafting on demand, and the distribution at
T > 0, are checked on tiny models in ``test_prespec.py``.
"""

from __future__ import annotations

import pytest

from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from tests.support.processes.workers import WorkerProcess
from tests.support.prompts import MAX_TOKENS, PROMPTS, ar_tokens
from tests.support.remote import generate_remote


@pytest.mark.anyio
async def test_prespec_is_lossless_at_t0(worker: WorkerProcess, default_f32: LoadedModel) -> None:
    prompts = [default_f32.tokenizer.encode(PROMPTS[2])]  # math, whose AR test_lossless already made
    batched = pb.PreSpeculation(enabled=True, batch=4)  # the default model's branches, four a pass
    runs = await generate_remote(
        worker.address, default_f32, prompts, 4, MAX_TOKENS, SamplingParams(), batched
    )
    for prompt, run in zip(prompts, runs, strict=True):
        assert run.result.tokens == ar_tokens(default_f32, prompt)
        served = [r.draft.speculation for r in run.result.rounds if r.draft.calls]
        assert served[0] == "" and all(s in ("hit", "partial", "miss") for s in served[1:])
        assert run.worker_counters.prespec_hits == served.count("hit")
        assert run.worker_counters.prespec_misses == served.count("miss")
        # Which rounds it serves whole depends on how this CPU shares its cores with the target; that
        # it drafted ahead does not (hits are tested on the tiny model, where timing is controlled).
        assert run.worker_counters.speculative_passes > 0
