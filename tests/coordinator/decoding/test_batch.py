"""Generations decoded together: one draft pass a draft and one verification pass for all of them.

Each row rolls back on its own in a ragged KV cache (and, for Qwen3.5's
layout, a recurrent state a row), so a row's output is
its output alone: at T = 0 the target's greedy output (``assert_lossless``:
a GPU may part only at a tie), and at T > 0 on MLX's CPU backend exactly
its ``--draft local`` run alone, since a row draws with the generators a
``Drafter`` and the engine use. Rows join between rounds, at different k
and lengths, and leave when they end or are halted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import gemma3_text
from mlx_lm.models.cache import make_prompt_cache

from coordinator.decoding.batch import DecodingBatch, batch_refusal
from coordinator.decoding.engine import Decoding, SpeculativeDecoder
from coordinator.drafting.local import LocalDraftSource
from specwire.drafting.sampling import SamplingParams
from specwire.errors import UnsupportedModelError
from specwire.models.loading import LoadedModel, load_model
from specwire.models.ragged_cache import batchable, kv_rows, ragged_cache
from tests.support.models.tiny_models import as_loaded
from tests.support.rounding import EXACT, PassRounding, assert_logits_within, assert_lossless

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def draft() -> LoadedModel:
    return load_model("tiny-draft")


def prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2000, size=n).tolist() for n in lengths]


def alone_and_begun(
    target: LoadedModel, asked: list[list[int]], budgets: tuple[int, ...]
) -> tuple[list[list[int]], list[Decoding]]:
    """Each prompt's greedy output alone (AR), and each begun as a generation to join a batch."""
    decoder = SpeculativeDecoder(target)
    pairs = list(zip(asked, budgets, strict=True))
    ar = [decoder.generate(p, max_tokens=m, k=0, params=GREEDY).tokens for p, m in pairs]
    return ar, [decoder.begin(p, max_tokens=m, k=0, params=GREEDY) for p, m in pairs]


def batch_rounding(model: LoadedModel) -> PassRounding:
    """``EXACT`` on the CPU; on a GPU, how far a row of a two-row pass rounds from the same row alone."""
    if mx.default_device() == mx.cpu:
        return EXACT
    tokens = mx.array([[5, 9, 14, 3], [7, 1, 8, 2]])
    pair = model.model(tokens, cache=make_prompt_cache(model.model))[0]
    alone = model.model(tokens[:1], cache=make_prompt_cache(model.model))[0]
    return PassRounding(float(mx.abs(pair - alone).max()), 0.0)


def test_each_row_keeps_what_its_own_cache_would_through_rollbacks_compaction_and_leaving(
    tiny: LoadedModel,
) -> None:
    model = tiny.model
    seqs = prompts(0, (7, 12, 1, 30))
    rounding = batch_rounding(tiny)
    layout, cache = ragged_cache(model)
    for seq in seqs:  # each row's cache holds all its tokens but the last two (one row: none)
        own = make_prompt_cache(model)
        if len(seq) > 2:
            model(mx.array([seq[:-2]]), cache=own)
        layout.add(kv_rows(own))
    fed = [seq[-2:] if len(seq) > 1 else [seq[0], 0] for seq in seqs]
    layout.begin(3)
    model(mx.array([[*f, 11] for f in fed]), cache=cache)  # a third token every row then rejects
    layout.commit(3, [3, 2, 1, 3])
    layout.truncate(0, len(seqs[0]))  # row 0 rejects its third after the pass
    layout.truncate(3, len(seqs[3]) - 1)  # row 3 rolls back into its own tokens
    layout.compact()
    layout.remove(1)  # row 1 ends
    kept = [seqs[0], seqs[2][:1], seqs[3][:-1]]
    layout.begin(1)
    logits = model(mx.array([[4], [4], [4]]), cache=cache)[:, 0]
    layout.commit(1, [1, 1, 1])
    assert layout.lengths() == [len(k) + 1 for k in kept]
    for row, tokens in enumerate(kept):
        alone = model(mx.array([[*tokens, 4]]), cache=make_prompt_cache(model))[0, -1]
        assert_logits_within(logits[row], alone, rounding, f"row {row}")


def test_rows_joining_between_rounds_at_their_own_k_each_equal_ar_at_t0(
    tiny: LoadedModel, draft: LoadedModel
) -> None:
    assert batchable(tiny.model) and batchable(draft.model)
    lengths, budgets, ks = (9, 30, 1, 17), (40, 25, 60, 33), (2, 4, 3, 0)
    asked = prompts(1, lengths)
    ar, rows = alone_and_begun(tiny, asked, budgets)
    batch = DecodingBatch(tiny, draft)
    for decoding, k in zip(rows[:2], ks[:2], strict=True):
        batch.join(decoding, k)
    ended = batch.round() + batch.round()
    for decoding, k in zip(rows[2:], ks[2:], strict=True):  # two more join two rounds in
        batch.join(decoding, k)
    while batch.rows:
        ended += batch.round()
    assert sorted(map(id, ended)) == sorted(map(id, rows))
    assert batch.widest == 4
    for prompt, decoding, want in zip(asked, rows, ar, strict=True):
        assert_lossless(tiny, prompt, want, decoding.result.tokens)
        assert decoding.result.finish_reason == "length"
    assert max(r.accepted for r in rows[1].result.rounds) > 0  # drafts were accepted, not only corrections


def test_a_generation_that_ran_alone_joins_where_it_stands(tiny: LoadedModel, draft: LoadedModel) -> None:
    prompt = prompts(2, (12,))[0]
    ar = SpeculativeDecoder(tiny).generate(prompt, max_tokens=30, k=0, params=GREEDY).tokens
    decoding = SpeculativeDecoder(tiny, LocalDraftSource(draft)).begin(
        prompt, max_tokens=30, k=3, params=GREEDY
    )
    for _ in range(3):
        decoding.round()
    batch = DecodingBatch(tiny, draft)
    batch.join(decoding, 2)
    assert decoding.source is None  # its own draft source closed
    while batch.rows:
        batch.round()
    assert_lossless(tiny, prompt, ar, decoding.result.tokens)


def test_a_halted_row_leaves_and_the_others_go_on(tiny: LoadedModel, draft: LoadedModel) -> None:
    asked = prompts(3, (8, 11))
    halt = threading.Event()
    decoder = SpeculativeDecoder(tiny)
    stopped = decoder.begin(asked[0], max_tokens=50, k=0, params=GREEDY, halt=halt)
    going = decoder.begin(asked[1], max_tokens=20, k=0, params=GREEDY)
    batch = DecodingBatch(tiny, draft)
    batch.join(stopped, 2)
    batch.join(going, 2)
    batch.round()
    halt.set()
    assert batch.round() == [stopped] and stopped.result.finish_reason == "halted"
    while batch.rows:
        batch.round()
    ar = SpeculativeDecoder(tiny).generate(asked[1], max_tokens=20, k=0, params=GREEDY).tokens
    assert_lossless(tiny, asked[1], ar, going.result.tokens)


@pytest.mark.skipif(
    mx.default_device() != mx.cpu, reason="a GPU may round a row of a batch apart from it alone"
)
def test_sampled_rows_each_equal_their_local_sd_run_alone(tiny: LoadedModel, draft: LoadedModel) -> None:
    asked = prompts(4, (9, 30, 4))
    params = [
        SamplingParams(temperature=0.8, seed=7),
        SamplingParams(temperature=1.0, top_p=0.9, seed=3),
        GREEDY,
    ]
    alone = [
        SpeculativeDecoder(tiny, LocalDraftSource(draft)).generate(p, max_tokens=30, k=3, params=s).tokens
        for p, s in zip(asked, params, strict=True)
    ]
    batch, decoder = DecodingBatch(tiny, draft), SpeculativeDecoder(tiny)
    rows = [decoder.begin(p, max_tokens=30, k=0, params=s) for p, s in zip(asked, params, strict=True)]
    for decoding in rows:
        batch.join(decoding, 3)
    while batch.rows:
        batch.round()
    assert [d.result.tokens for d in rows] == alone


def test_the_last_row_goes_on_alone_where_it_stands(tiny: LoadedModel, draft: LoadedModel) -> None:
    asked = prompts(5, (10, 6))
    decoder = SpeculativeDecoder(tiny)
    short = decoder.begin(asked[0], max_tokens=6, k=0, params=GREEDY)
    long = decoder.begin(asked[1], max_tokens=40, k=0, params=GREEDY)
    batch = DecodingBatch(tiny, draft)
    batch.join(short, 3)
    batch.join(long, 3)
    while short in [row.decoding for row in batch.rows]:
        batch.round()
    assert batch.release() is long and not batch.rows
    source = LocalDraftSource(draft)
    source.start(long.context(), GREEDY, 4)
    long.attach_source(source, 4)
    while long.round():
        pass
    long.close()
    assert any(r.draft.forward_passes == 4 for r in long.result.rounds)  # drafted alone at its own k
    ar = SpeculativeDecoder(tiny).generate(asked[1], max_tokens=40, k=0, params=GREEDY).tokens
    assert_lossless(tiny, asked[1], ar, long.result.tokens)


@pytest.fixture(scope="module")
def hybrid_pair() -> tuple[LoadedModel, LoadedModel]:
    return load_model("tiny-hybrid"), load_model("tiny-hybrid-draft")


def test_hybrid_rows_keep_their_own_recurrent_state_and_each_equal_ar_at_t0(
    hybrid_pair: tuple[LoadedModel, LoadedModel],
) -> None:
    # Qwen3.5's layout: a Gated DeltaNet layer's state goes back row by row, on the target (the state
    # after each row's accepted tokens) and on the draft (after the pass its verdict keeps).
    target, draft = hybrid_pair
    lengths, budgets = (9, 30, 1), (30, 20, 40)
    asked = prompts(6, lengths)
    ar, rows = alone_and_begun(target, asked, budgets)
    batch = DecodingBatch(target, draft)
    batch.join(rows[0], 3)
    batch.round()
    for decoding in rows[1:]:
        batch.join(decoding, 3)
    while len(batch.rows) > 1:
        batch.round()
    alone = batch.release()  # the last one goes on by itself, from the states the batch kept
    source = LocalDraftSource(draft)
    source.start(alone.context(), GREEDY, 3)
    alone.attach_source(source, 3)
    while alone.round():
        pass
    alone.close()
    for prompt, decoding, want in zip(asked, rows, ar, strict=True):
        assert_lossless(target, prompt, want, decoding.result.tokens)
    assert sum(r.accepted for d in rows for r in d.result.rounds) > 0


@pytest.mark.skipif(mx.default_device() != mx.cpu, reason="a GPU may round a batch's row apart from it alone")
def test_sampled_hybrid_rows_each_equal_their_local_sd_run_alone(
    hybrid_pair: tuple[LoadedModel, LoadedModel],
) -> None:
    target, draft = hybrid_pair
    asked = prompts(7, (12, 5))
    params = SamplingParams(temperature=0.8, seed=11)
    alone = [
        SpeculativeDecoder(target, LocalDraftSource(draft))
        .generate(p, max_tokens=24, k=3, params=params)
        .tokens
        for p in asked
    ]
    batch, decoder = DecodingBatch(target, draft), SpeculativeDecoder(target)
    rows = [decoder.begin(p, max_tokens=24, k=0, params=params) for p in asked]
    for decoding in rows:
        batch.join(decoding, 3)
    while batch.rows:
        batch.round()
    assert [d.result.tokens for d in rows] == alone


def test_a_model_with_a_sliding_window_is_refused_in_one_line(tiny: LoadedModel) -> None:
    args = {
        "model_type": "gemma3_text", "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "query_pre_attn_scalar": 8,
        "rms_norm_eps": 1e-6, "vocab_size": 64, "max_position_embeddings": 512, "rope_theta": 10000.0,
        "sliding_window": 4, "sliding_window_pattern": 2,
    }  # fmt: skip
    windowed = as_loaded(gemma3_text.Model(gemma3_text.ModelArgs.from_dict(args)), args, "gemma3-window")
    said = batch_refusal(tiny, windowed)
    assert said is not None and "gemma3-window" in said and "\n" not in said
    with pytest.raises(UnsupportedModelError, match="gemma3-window"):
        DecodingBatch(tiny, windowed)


def test_a_round_with_no_drafts_keeps_no_draft_state_for_the_next(
    hybrid_pair: tuple[LoadedModel, LoadedModel],
) -> None:
    # A round where no row drafts (k = 0, or one token left) once put the round before's recurrent draft
    # states back, for rows that had since changed: a row joining next failed, or drafted from a wrong state.
    target, draft = hybrid_pair
    rng = np.random.default_rng(0)
    asked = [rng.integers(0, 2000, size=n).tolist() for n in (5, 7, 9, 6)]
    batch, decoder = DecodingBatch(target, draft), SpeculativeDecoder(target)
    batch.join(decoder.begin(asked[0], max_tokens=2, k=0, params=GREEDY), 3)
    batch.round()  # it drafts one token: the draft's states are kept for its one row
    for prompt in asked[1:3]:
        batch.join(decoder.begin(prompt, max_tokens=30, k=0, params=GREEDY), 0)
    batch.round()  # no row drafts
    last = decoder.begin(asked[3], max_tokens=30, k=0, params=GREEDY)
    while batch.rows:
        if len(batch.rows) <= 2 and last.result.tokens == [] and last not in [r.decoding for r in batch.rows]:
            batch.join(last, 3)
        batch.round()
    ar = SpeculativeDecoder(target).generate(asked[3], max_tokens=30, k=0, params=GREEDY).tokens
    assert_lossless(target, asked[3], ar, last.result.tokens)


def test_a_long_row_beside_short_ones_does_not_make_every_round_compact(
    tiny: LoadedModel, draft: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch, decoder = DecodingBatch(tiny, draft), SpeculativeDecoder(tiny)
    for length, k in ((300, 2), (4, 2), (6, 2)):
        batch.join(decoder.begin(prompts(9, (length,))[0], max_tokens=40, k=0, params=GREEDY), k)
    compactions: list[int] = []
    for layout in (batch.target_layout, batch.draft_layout):

        def counted(compact: Callable[[], None] = layout.compact) -> None:
            compactions.append(1)
            compact()

        monkeypatch.setattr(layout, "compact", counted)
    while batch.rows:
        batch.round()
    assert batch.rounds >= 10 and len(compactions) <= 2  # the short rows' left padding is no hole to remove
