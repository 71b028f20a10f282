"""Hybrid draft models (Qwen3.5's layout) on a real worker: the per-op walk and the stream protocol.

The worker serves ``tiny-hybrid-draft`` (a Gated DeltaNet block and a gated
attention block); the target is ``tiny-hybrid``, which accepts some of
its drafts, so rejected drafts roll the worker's recurrent state back.
"""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError
from specwire.models.delta_scan import CHUNK
from specwire.models.loading import LoadedModel, load_model
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name
from tests.support.prompts import PROMPTS, ar_tokens
from tests.support.remote import assert_per_op_drafts_as_stream, generate_per_op, generate_remote
from tests.support.rounding import assert_lossless, assert_rejections_are_ties
from tests.support.walks import ops, walked
from worker.per_op.op_walk import trace
from worker.per_op.tensor_session import MAX_KEPT, UNSPOKEN

pytestmark = pytest.mark.anyio
TOKENS = 24
# Longer than any round and than one of the delta scan's chunks: its prefill takes the scan on a CPU.
LONG_PROMPT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the wick, wound the "
    "clockwork that turned the great lens, and wrote the weather in a leather logbook. On the night of the "
    "storm the glass fell faster than he had ever seen it fall, and the boats were still out past the reef "
    "when the first wave broke over the harbour wall"
)


@pytest.fixture(scope="module")
def hybrid() -> LoadedModel:
    return load_model("tiny-hybrid")


@pytest.fixture(scope="module")
def hybrid_draft() -> LoadedModel:
    return load_model("tiny-hybrid-draft")


@pytest.fixture(scope="module")
def hybrid_worker() -> Iterator[WorkerProcess]:
    with running_worker("--model", "tiny-hybrid-draft", "--name", unique_name("hybrid-worker")) as w:
        yield w


def test_the_walk_of_a_hybrid_model_follows_its_blocks(hybrid: LoadedModel) -> None:
    session, graph = walked(hybrid)
    assert session.walk.recurrent and graph.walk.recurrent
    per_block = [[session.walk.steps[i] for i in range(len(session.walk.steps)) if f"layers.{b}." in
                  session.walk.steps[i]] for b in range(2)]  # fmt: skip
    assert any(":gated_delta_update" in s for s in per_block[0])  # block 0 is a Gated DeltaNet
    assert any(":scaled_dot_product_attention" in s for s in per_block[1])  # block 1 a gated attention
    assert len(graph.forward(0, [1])) == 2 + 2  # before, two blocks, after


def test_walked_hybrid_pass_gives_the_models_own_logits(hybrid_draft: LoadedModel) -> None:
    # The model's own pass, stopped before each operation, state carried in its own cache: bit-exact
    # on the CPU, across passes and after a rollback.
    session, graph = walked(hybrid_draft)
    cache = make_prompt_cache(hybrid_draft.model)
    tokens = hybrid_draft.tokenizer.encode(PROMPTS[2])[:9]

    def walked_row(offset: int, fed: list[int]) -> np.ndarray:
        pass_ops = ops(graph, offset, fed)
        assert len(pass_ops) == session.walk.ops_per_pass
        row = np.frombuffer(session.execute(pass_ops).tensors[-1], dtype=np.float32)
        # the whole vocabulary's row; past the ids the emulation model speaks, logits no softmax weighs
        spoken = hybrid_draft.model.language_model.lm_head.weight.shape[0]
        assert row.size == hybrid_draft.vocab_size and np.all(row[spoken:] == UNSPOKEN)
        return row[:spoken]

    def whole(fed: list[int]) -> np.ndarray:
        return np.array(hybrid_draft.model(mx.array([fed]), cache=cache)[0, -1].astype(mx.float32))

    assert np.array_equal(walked_row(0, tokens[:6]), whole(tokens[:6]))
    assert np.array_equal(walked_row(6, tokens[6:8]), whole(tokens[6:8]))
    session.execute([graph.trim(2)])  # back to the end of the first pass, where the state was kept
    cache = make_prompt_cache(hybrid_draft.model)
    whole(tokens[:6])
    assert np.array_equal(walked_row(6, tokens[7:9]), whole(tokens[7:9]))


def test_rollbacks_go_only_to_kept_pass_ends_and_the_kept_states_are_bounded(
    hybrid_draft: LoadedModel,
) -> None:
    session, graph = walked(hybrid_draft)
    session.execute(ops(graph, 0, [5, 6, 7, 8]))
    with pytest.raises(InvalidArgumentError, match="position 2 is not one"):
        session.execute([graph.trim(2)])
    with pytest.raises(InvalidArgumentError, match="the session ended at a refused operation"):
        session.execute([graph.trim(4)])  # its cache may hold half a pass: the session is over

    session, graph = walked(hybrid_draft)
    session.execute(ops(graph, 0, [5, 6, 7, 8]))
    session.execute([op for group in graph.forward(4, [9])[:2] for op in group])  # embedding and block 0
    with pytest.raises(InvalidArgumentError, match="middle of a forward pass"):
        session.execute([graph.trim(4)])

    session, graph = walked(hybrid_draft)
    for position in range(MAX_KEPT + 4):
        session.execute(ops(graph, position, [9]))
    assert len(session.checkpoints.kept) == MAX_KEPT
    session.execute([graph.trim(MAX_KEPT - 1)])  # the oldest pass end still kept


@pytest.mark.parametrize("granularity", ["op", "token", "round"])
async def test_per_op_with_a_hybrid_draft_is_lossless(
    hybrid_worker: WorkerProcess, hybrid: LoadedModel, granularity: str
) -> None:
    prompt = hybrid.tokenizer.encode(PROMPTS[1])  # the pair parts here within the first rounds
    tokens = TOKENS if granularity != "op" else TOKENS // 2
    (run,) = await generate_per_op(
        hybrid_worker.address, hybrid, [prompt], 4, tokens, SamplingParams(), granularity
    )
    assert_lossless(hybrid, prompt, ar_tokens(hybrid, prompt, tokens), run.result.tokens)
    assert any(r.accepted < r.drafted for r in run.result.rounds)  # the worker rolled its state back
    assert run.client_ops == run.worker_counters.ops
    (stream,) = await generate_remote(hybrid_worker.address, hybrid, [prompt], 4, tokens, SamplingParams())
    assert [r.draft.tokens for r in run.result.rounds] == [r.draft.tokens for r in stream.result.rounds]


async def test_per_op_walks_a_long_prompts_delta_scan_losslessly(
    hybrid_worker: WorkerProcess, hybrid: LoadedModel, hybrid_draft: LoadedModel
) -> None:
    # The worker's Gated DeltaNet layer runs a long prompt's prefill as a delta scan on a CPU
    # (specwire.models.delta_scan); the walk stops at it as the one gated delta rule operation, and drafts
    # on from there one call per operation.
    prompt = hybrid.tokenizer.encode(LONG_PROMPT)
    assert len(prompt) > CHUNK + 1
    (run,) = await generate_per_op(hybrid_worker.address, hybrid, [prompt], 4, TOKENS, SamplingParams(), "op")
    assert_lossless(hybrid, prompt, ar_tokens(hybrid, prompt, TOKENS), run.result.tokens)
    assert any(r.accepted < r.drafted for r in run.result.rounds)  # the worker rolled its state back
    ops_per_pass = trace(hybrid_draft.model).ops_per_pass
    assert run.prefill_calls == ops_per_pass  # the prompt in one pass, one call per operation
    assert run.client_ops == run.client_calls == run.worker_counters.ops
    draft_calls = sum(len(r.draft.calls) for r in run.result.rounds)  # a pass per draft token, and the trims
    assert run.result.drafted * ops_per_pass < draft_calls < run.result.drafted * (ops_per_pass + 1)
    (stream,) = await generate_remote(hybrid_worker.address, hybrid, [prompt], 4, TOKENS, SamplingParams())
    assert [r.draft.tokens for r in run.result.rounds] == [r.draft.tokens for r in stream.result.rounds]


async def test_a_hybrid_drafting_for_itself_has_every_draft_accepted_on_both_backends(
    hybrid_worker: WorkerProcess, hybrid_draft: LoadedModel
) -> None:
    # The worker's model as the target: every round accepts all k drafts and the bonus token (but at a
    # tie within a GPU's rounding), so neither side rolls back, and the caches move on by whole rounds.
    prompt = hybrid_draft.tokenizer.encode(PROMPTS[1])
    (per_op,) = await generate_per_op(
        hybrid_worker.address, hybrid_draft, [prompt], 4, TOKENS, SamplingParams(), "token"
    )
    (stream,) = await generate_remote(
        hybrid_worker.address, hybrid_draft, [prompt], 4, TOKENS, SamplingParams()
    )
    for run in (per_op, stream):
        assert_lossless(hybrid_draft, prompt, ar_tokens(hybrid_draft, prompt, TOKENS), run.result.tokens)
        assert_rejections_are_ties(hybrid_draft, prompt, run.result)
        rejected = sum(r.accepted < r.drafted for r in run.result.rounds)
        assert run.result.rollback is not None and run.result.rollback.rounds == rejected


async def test_sampled_hybrid_drafts_match_the_stream_backend(
    hybrid_worker: WorkerProcess, hybrid: LoadedModel
) -> None:
    params = SamplingParams(temperature=0.8, seed=3)
    prompt = hybrid.tokenizer.encode(PROMPTS[4])
    await assert_per_op_drafts_as_stream(hybrid_worker.address, hybrid, prompt, 3, TOKENS, params)


async def test_a_llama_worker_drafts_for_a_hybrid_target(
    tiny_worker: WorkerProcess, hybrid: LoadedModel
) -> None:
    prompt = hybrid.tokenizer.encode(PROMPTS[0])
    (run,) = await generate_per_op(
        tiny_worker.address, hybrid, [prompt], 3, TOKENS, SamplingParams(), "token"
    )
    assert_lossless(hybrid, prompt, ar_tokens(hybrid, prompt, TOKENS), run.result.tokens)
