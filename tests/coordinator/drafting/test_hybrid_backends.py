"""Hybrid draft models (Qwen3.5's layout) on a real worker: the per-op walk and the stream protocol.

The worker serves ``tiny-hybrid-draft`` (three Gated DeltaNet blocks and a
gated attention block); the target is ``tiny-hybrid``, which accepts some of
its drafts, so rejected drafts roll the worker's recurrent state back.
"""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from coordinator.drafting.ggml_rpc.graph import ForwardGraph, ModelShape
from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError, UnsupportedModelError
from specwire.models import LoadedModel, load_model
from specwire.models.op_counts import block_kinds, ops_per_pass
from tests.support.prompts import PROMPTS, ar_tokens
from tests.support.remote import assert_per_op_drafts_as_stream, generate_per_op, generate_remote
from tests.support.rounding import assert_lossless, assert_rejections_are_ties
from tests.support.workers import WorkerProcess, running_worker, unique_name
from worker.tensor_modules import ModuleTable
from worker.tensor_session import MAX_KEPT, UNSPOKEN, TensorSession

pytestmark = pytest.mark.anyio
TOKENS = 24
# Qwen3.5-0.8B's text config (the paper's draft model): 24 blocks, full attention every fourth.
QWEN35_08B = {
    "model_type": "qwen3_5",
    "text_config": {"num_hidden_layers": 24, "full_attention_interval": 4, "num_attention_heads": 8},
}


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


def test_op_counts_follow_the_block_kinds(hybrid: LoadedModel) -> None:
    assert block_kinds(hybrid.args) == ["gated_delta", "gated_attention"]
    assert ops_per_pass(hybrid.args) == 18 + 21 + 5
    assert ops_per_pass(QWEN35_08B) == 18 * 18 + 6 * 21 + 5 == 455
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts"):
        block_kinds({**QWEN35_08B, "text_config": {**QWEN35_08B["text_config"], "num_experts": 64}})
    with pytest.raises(UnsupportedModelError, match="'qwen3_next'"):
        block_kinds({"model_type": "qwen3_next", "num_hidden_layers": 48})


def test_walked_hybrid_pass_gives_the_models_own_logits(hybrid_draft: LoadedModel) -> None:
    # The same kernels in the same order as the model run whole, state carried in the same cache
    # kinds: bit-exact on the CPU, across passes and after a rollback.
    table = ModuleTable.of(hybrid_draft.model)
    session = TensorSession(hybrid_draft, table, tag=1)
    graph = ForwardGraph(ModelShape.from_config(hybrid_draft.args), table.names, 1)
    cache = make_prompt_cache(hybrid_draft.model)
    tokens = hybrid_draft.tokenizer.encode(PROMPTS[2])[:9]

    def walked(offset: int, fed: list[int]) -> np.ndarray:
        ops = [op for group in graph.forward(offset, fed) for op in group]
        assert len(ops) == ops_per_pass(hybrid_draft.args)
        row = np.frombuffer(session.execute(ops).tensors[-1], dtype=np.float32)
        # the whole vocabulary's row; past the ids the emulation model speaks, logits no softmax weighs
        spoken = hybrid_draft.model.language_model.lm_head.weight.shape[0]
        assert row.size == hybrid_draft.vocab_size and np.all(row[spoken:] == UNSPOKEN)
        return row[:spoken]

    def whole(fed: list[int]) -> np.ndarray:
        return np.array(hybrid_draft.model(mx.array([fed]), cache=cache)[0, -1].astype(mx.float32))

    assert np.array_equal(walked(0, tokens[:6]), whole(tokens[:6]))
    assert np.array_equal(walked(6, tokens[6:8]), whole(tokens[6:8]))
    session.execute([graph.trim(2)])  # back to the end of the first pass, where the state was kept
    cache = make_prompt_cache(hybrid_draft.model)
    whole(tokens[:6])
    assert np.array_equal(walked(6, tokens[7:9]), whole(tokens[7:9]))


def test_a_rollback_to_a_position_not_kept_is_refused_and_the_session_goes_on(
    hybrid_draft: LoadedModel,
) -> None:
    table = ModuleTable.of(hybrid_draft.model)
    session = TensorSession(hybrid_draft, table, tag=1)
    graph = ForwardGraph(ModelShape.from_config(hybrid_draft.args), table.names, 1)
    forward = [op for group in graph.forward(0, [5, 6, 7, 8]) for op in group]
    session.execute(forward)
    with pytest.raises(InvalidArgumentError, match="position 2 is not one"):
        session.execute([graph.trim(2)])
    mid_pass = [op for group in graph.forward(4, [9])[:2] for op in group]  # embedding and block 0 only
    session.execute(mid_pass)
    with pytest.raises(InvalidArgumentError, match="middle of a forward pass"):
        session.execute([graph.trim(4)])
    for position in range(MAX_KEPT + 4):  # the kept states are bounded
        ops = [op for group in graph.forward(4 + position, [9]) for op in group]
        if position == 0:
            ops = ops[len(mid_pass) :]  # finish the pass begun above
        session.execute(ops)
    assert len(session.checkpoints.kept) == MAX_KEPT


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
