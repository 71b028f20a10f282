"""The GGML_RPC-style per-op baseline against real workers.

Call and operation counts run on the tiny model (same graph shape, two
blocks); lossless drafting and bit-exact logits on the real default model.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from coordinator.drafting.ggml_rpc.source import PerOpDraftSource
from coordinator.runtime import coordinator_runtime
from coordinator.workers.connection import connect
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from tests.support.credentials import credentials
from tests.support.processes.workers import WorkerProcess
from tests.support.prompts import PROMPTS, ar_tokens
from tests.support.remote import PerOpRun, assert_per_op_drafts_as_stream, generate_per_op, generate_remote
from worker.per_op.op_walk import trace

pytestmark = pytest.mark.anyio
MAX_TOKENS = 8


def ops_per_forward_pass(model: nn.Module) -> int:
    """Count the operations of one forward pass from the model's own modules.

    Every leaf module of a block is called once, but its RoPE twice (queries,
    keys); the KV-cache write and attention are one kernel each; around the
    blocks, the token ids go up, the embedding runs, the final norm and the LM
    head (the embedding again, when tied) run, and the logits row comes back.
    """
    per_block = 0
    for layer in model.layers:
        leaves = [m for _, m in layer.named_modules() if not m.children()]
        per_block += len(leaves) + sum(isinstance(m, nn.RoPE) for m in leaves) + 2
    return per_block + 5


def drafting_calls(run: PerOpRun, per_call: int, granularity: str, forward_ops: int) -> int:
    """Calls the drafting rounds must have made, from the engine's own round records."""
    calls = 0
    for i, r in enumerate(run.result.rounds):
        if granularity == "round":
            calls += 1 if r.drafted else 0
        else:
            calls += r.drafted * per_call
        previous = run.result.rounds[i - 1] if i else None
        if granularity == "op" and previous is not None and previous.drafted:
            fed = previous.drafted - 1
            calls += 1 if previous.accepted < fed else 0  # a KV_TRIM call rolls back rejected drafts
    return calls


def test_op_count_comes_from_the_model(default_q4: LoadedModel, tiny: LoadedModel) -> None:
    assert trace(default_q4.model).ops_per_pass == ops_per_forward_pass(default_q4.model) == 13 * 30 + 5
    assert trace(tiny.model).ops_per_pass == ops_per_forward_pass(tiny.model) == 13 * 2 + 5


async def test_every_op_ran_remotely_once(tiny_worker: WorkerProcess, tiny: LoadedModel) -> None:
    forward_ops = ops_per_forward_pass(tiny.model)
    prompt = tiny.tokenizer.encode(PROMPTS[3])
    (run,) = await generate_per_op(
        tiny_worker.address, tiny, [prompt], 3, 4 * MAX_TOKENS, SamplingParams(), "op"
    )
    assert run.prefill_calls == forward_ops  # the prompt's one prefill pass
    expected = run.prefill_calls + drafting_calls(run, forward_ops, "op", forward_ops)
    assert run.client_calls == expected == run.worker_counters.graphs
    assert run.client_ops == run.client_calls == run.worker_counters.ops  # one op per call
    assert run.worker_counters.messages_received == run.client_calls + 1  # plus the TensorOpen
    draft_calls = sum(len(r.draft.calls) for r in run.result.rounds)
    assert draft_calls == expected - run.prefill_calls
    assert run.worker_counters.tensor_bytes == 4 * tiny.vocab_size * (run.result.drafted + 1)


@pytest.mark.parametrize(("granularity", "per_pass"), [("layer", 4), ("token", 1), ("round", None)])
async def test_calls_per_token_match_each_granularity(
    tiny_worker: WorkerProcess, tiny: LoadedModel, granularity: str, per_pass: int | None
) -> None:
    worker, tokens = tiny_worker, 4 * MAX_TOKENS
    prompt = tiny.tokenizer.encode(PROMPTS[0])
    (run,) = await generate_per_op(worker.address, tiny, [prompt], 3, tokens, SamplingParams(), granularity)
    if per_pass is not None:
        assert per_pass == len(tiny.model.layers) + 2 or per_pass == 1
    expected_prefill = per_pass if per_pass is not None else 1
    assert run.prefill_calls == expected_prefill
    expected = run.prefill_calls + drafting_calls(run, per_pass or 0, granularity, 0)
    assert run.client_calls == expected == run.worker_counters.graphs
    if granularity == "round":
        (stream,) = await generate_remote(worker.address, tiny, [prompt], 3, tokens, SamplingParams())
        drafting_rounds = sum(1 for r in run.result.rounds if r.drafted)
        stream_rounds = sum(1 for r in stream.result.rounds if r.drafted)
        assert drafting_rounds == stream_rounds == run.client_calls - run.prefill_calls


async def test_per_op_is_lossless_and_drafts_what_the_stream_backend_drafts(
    worker: WorkerProcess, default_f32: LoadedModel
) -> None:
    prompts = [default_f32.tokenizer.encode(p) for p in PROMPTS[:2]]
    per_op = await generate_per_op(
        worker.address, default_f32, prompts[:1], 3, MAX_TOKENS, SamplingParams(), "op"
    )
    per_op += await generate_per_op(
        worker.address, default_f32, prompts[1:], 3, MAX_TOKENS, SamplingParams(), "token"
    )
    stream = await generate_remote(worker.address, default_f32, prompts, 3, MAX_TOKENS, SamplingParams())
    for prompt, a, b in zip(prompts, per_op, stream, strict=True):
        assert a.result.tokens == b.result.tokens == ar_tokens(default_f32, prompt, MAX_TOKENS)
        assert [r.accepted for r in a.result.rounds] == [r.accepted for r in b.result.rounds]
        assert [r.draft.tokens for r in a.result.rounds] == [r.draft.tokens for r in b.result.rounds]


async def test_sampled_drafts_match_the_stream_backend(tiny_worker: WorkerProcess, tiny: LoadedModel) -> None:
    params = SamplingParams(temperature=0.8, seed=5)
    prompt = tiny.tokenizer.encode(PROMPTS[4])
    await assert_per_op_drafts_as_stream(tiny_worker.address, tiny, prompt, 3, 4 * MAX_TOKENS, params)


async def test_walked_forward_pass_gives_the_models_own_logits(
    worker: WorkerProcess, default_q4: LoadedModel
) -> None:
    # Same kernels, same order: the logits of a pass walked op by op equal the model's own pass over
    # the same positions, bit for bit, on every backend (the same tokens split into other passes round
    # differently on a GPU; that is batching, not walking: tests/coordinator/decoding/test_lossless.py).
    prompt = default_q4.tokenizer.encode(PROMPTS[1])
    async with coordinator_runtime() as runtime:
        connection = await connect(worker.address, credentials())
        try:
            source = PerOpDraftSource(runtime.portal, connection, default_q4.fingerprint, "op")
            # start() prefills all but the last of its tokens: prompt[0] lands in the worker's cache.
            await runtime.compute.run(source.start, prompt[:2], SamplingParams(), 1)
            drafter = source._drafter
            assert drafter is not None

            def both() -> tuple[np.ndarray, np.ndarray]:  # MLX work stays on the compute thread
                remote = drafter.model(mx.array([prompt[1:]]))
                cache = make_prompt_cache(default_q4.model)  # the worker's state: prompt[0] prefilled
                mx.eval(default_q4.model(mx.array([prompt[:1]]), cache=cache))
                local = default_q4.model(mx.array([prompt[1:]]), cache=cache)[:, -1:, :]
                return np.array(remote), np.array(local.astype(mx.float32))

            remote, local = await runtime.compute.run(both)
            assert np.array_equal(remote, local)
            await runtime.compute.run(source.close)
        finally:
            await connection.close()
