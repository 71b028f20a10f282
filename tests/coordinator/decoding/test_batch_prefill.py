"""Generations admitted together: their prompts prefilled in the same passes, then joined at once.

Each row's output is still its output alone (T = 0: ``assert_lossless``),
a row that hits the prompt cache prefills only its suffix, every prompt is
kept in the prompt cache as a prefill alone keeps it, and a hybrid target
is prefilled one prompt at a time.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from coordinator.decoding import batch as batch_module
from coordinator.decoding import batch_prefill
from coordinator.decoding.batch import DecodingBatch
from coordinator.decoding.batch_prefill import PAD_SHARE, length_groups
from coordinator.decoding.engine import SpeculativeDecoder
from specwire.drafting.prefix_cache import PrefixCache
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel, load_model
from specwire.models.ragged_cache import kv_rows, ragged_cache
from tests.support.rounding import assert_lossless

GREEDY = SamplingParams()


def prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2000, size=n).tolist() for n in lengths]


def alone(target: LoadedModel, asked: list[list[int]], budget: int) -> list[list[int]]:
    decoder = SpeculativeDecoder(target)
    return [decoder.generate(p, max_tokens=budget, k=0, params=GREEDY).tokens for p in asked]


def test_rows_admitted_together_each_equal_ar_and_hits_prefill_only_their_suffix(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_prefill, "pad_share", lambda: PAD_SHARE)  # padded passes on a CPU too
    draft = load_model("tiny-draft")
    asked = prompts(3, (9, 40, 1, 17, 2, 600))
    asked.append([*asked[1][:30], 7, 8, 9])  # shares 30 tokens with a prompt the cache holds
    ar = alone(tiny, asked, 24)
    cache = PrefixCache()
    decoder = SpeculativeDecoder(tiny, prefix_cache=cache)
    decoder.generate(asked[1], max_tokens=1, k=0, params=GREEDY)  # the prompt cache now holds it
    running = decoder.begin(asked[0], max_tokens=24, k=0, params=GREEDY)
    batch = DecodingBatch(tiny, draft)
    batch.join(running, 2)
    batch.round()  # one row already decoding when the others arrive
    admitted = [decoder.begin(p, max_tokens=24, k=0, params=GREEDY, prefill=False) for p in asked[1:]]
    ks = [2, 0, 3, 0, 1, 2]
    batch.admit(admitted, ks)
    assert [row.k for row in batch.rows[1:]] == [ks[admitted.index(r.decoding)] for r in batch.rows[1:]]
    cached = [d.result.cached_tokens for d in admitted]
    assert cached[0] == len(asked[1]) - 1 and cached[-1] == 30 and cached[1:-1] == [0, 0, 0, 0]
    while batch.rows:
        batch.round()
    for prompt, decoding, want in zip(asked, [running, *admitted], ar, strict=True):
        assert_lossless(tiny, prompt, want, decoding.result.tokens)
    for prompt in asked[2:]:  # each prompt (but its last token) kept, as a prefill alone keeps it
        if len(prompt) > 1:
            assert cache.restore(make_prompt_cache(tiny.model), prompt[:-1]).cached == len(prompt) - 1


def test_a_hybrid_target_admits_its_rows_one_at_a_time_each_equal_ar() -> None:
    target, draft = load_model("tiny-hybrid"), load_model("tiny-hybrid-draft")
    asked = prompts(4, (9, 30, 1))
    ar = alone(target, asked, 20)
    decoder = SpeculativeDecoder(target)
    admitted = [decoder.begin(p, max_tokens=20, k=0, params=GREEDY, prefill=False) for p in asked]
    batch = DecodingBatch(target, draft)
    batch.admit(admitted, [3, 0, 2])
    assert [row.decoding for row in batch.rows] == admitted  # in order: joined one by one
    while batch.rows:
        batch.round()
    for prompt, decoding, want in zip(asked, admitted, ar, strict=True):
        assert_lossless(target, prompt, want, decoding.result.tokens)


def test_a_failed_admission_leaves_the_batch_as_it_was(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = prompts(5, (9, 300, 4, 4))  # two groups on either device: the long prompt first
    decoder = SpeculativeDecoder(tiny)
    running = decoder.begin(asked[0], max_tokens=8, k=0, params=GREEDY)
    batch = DecodingBatch(tiny, None)
    batch.join(running, 0)
    before = batch.target_layout.row(0)
    calls = []

    def failing(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return batch_prefill.prefill_together(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(batch_module, "prefill_together", failing)
    admitted = [decoder.begin(p, max_tokens=8, k=0, params=GREEDY, prefill=False) for p in asked[1:]]
    with pytest.raises(RuntimeError, match="out of memory"):
        batch.admit(admitted, [0, 0, 0])
    assert len(calls) == 2  # the first group had joined
    assert len(batch.rows) == batch.target_layout.rows == batch.draft_layout.rows == 1
    after = batch.target_layout.row(0)
    assert before is not None and after is not None
    assert all(mx.array_equal(a[0], b[0]).item() for a, b in zip(before, after, strict=True))
    while batch.rows:
        batch.round()
    assert len(running.result.tokens) == 8


@pytest.mark.parametrize("lengths", [(1000, 10, 10, 10, 10), (30, 28, 25, 3, 0, 0), (5,), ()])
def test_length_groups_cover_every_row_and_bound_the_padding(lengths: tuple[int, ...]) -> None:
    groups = length_groups(lengths, PAD_SHARE)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        widest = max(lengths[i] for i in group)
        own = sum(lengths[i] for i in group)
        assert len(group) == 1 or len(group) * widest <= PAD_SHARE * own
    if lengths == (1000, 10, 10, 10, 10):
        assert len(groups) > 1  # the long prompt does not pad the four short ones to its length
    unpadded = length_groups(lengths, 1.0)  # a CPU's: only prompts of one length share a pass
    assert all(len({lengths[i] for i in group}) == 1 for group in unpadded)


def test_extending_a_layout_keeps_every_rows_keys(tiny: LoadedModel) -> None:
    model = tiny.model
    seqs = prompts(6, (7, 20, 3))
    layout, _ = ragged_cache(model)
    own_rows = []
    for seq in seqs:
        own = make_prompt_cache(model)
        model(mx.array([seq]), cache=own)
        own_rows.append(kv_rows(own))
    layout.add(own_rows[0])
    layout.extend(layout.holding(own_rows[1:]))
    layout.add(None)  # a row with no position yet
    assert layout.lengths() == [7, 20, 3, 0]
    for b, want in enumerate(own_rows):
        got = layout.row(b)
        assert got is not None and want is not None
        for (k, v), (wk, wv) in zip(got, want, strict=True):
            assert k is not None and v is not None and wk is not None and wv is not None
            assert mx.array_equal(k, wk).item() and mx.array_equal(v, wv).item()
