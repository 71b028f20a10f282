"""The prompt cache: a reused prefill is the prefill, bounded, and scoped.

Tiny random-weight models: a llama (KV caches only: any shared prefix is
reused) and ``tiny-hybrid`` (Qwen3.5's layout: a recurrent state is reused
only at a cached prompt's end).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from specwire.drafting.drafter import prefill
from specwire.drafting.prefix_cache import PrefixCache
from specwire.models.loading import LoadedModel, load_model
from tests.support.models.tiny_models import tiny_llama

PREFIX = [3, 1, 4, 1, 5, 2, 6, 5, 3, 5, 7, 2, 7, 1, 6, 2, 4, 3, 3, 2]


@pytest.fixture(scope="module")
def hybrid() -> LoadedModel:
    return load_model("tiny-hybrid")


def next_logits(model: object, cache: list, token: int) -> np.ndarray:
    return np.array(model(mx.array([[token]]), cache=cache)[0, -1])  # type: ignore[operator]


def cold(model: object, tokens: list[int], token: int, cut: int) -> np.ndarray:
    """The logits after prefilling ``tokens`` with no cache, in the same passes as a reuse of ``cut``."""
    cache = make_prompt_cache(model)  # type: ignore[arg-type]
    prefill(model, cache, tokens[:cut])  # type: ignore[arg-type]
    prefill(model, cache, tokens[cut:])  # type: ignore[arg-type]
    return next_logits(model, cache, token)


def warm(
    model: object, store: PrefixCache, tokens: list[int], token: int, scope: str = ""
) -> tuple[int, np.ndarray]:
    cache = make_prompt_cache(model)  # type: ignore[arg-type]
    reuse = store.restore(cache, tokens, scope)
    prefill(model, cache, tokens[reuse.cached :])  # type: ignore[arg-type]
    store.store(tokens, cache, scope)
    return reuse.cached, next_logits(model, cache, token)


def test_a_reused_prefill_gives_the_models_own_logits_and_survives_the_cache_writing_on() -> None:
    model, _ = tiny_llama(0)
    store = PrefixCache()
    assert warm(model, store, PREFIX, 4)[0] == 0
    # extending it (which replaces it), branching off the extension, the prefix itself again
    for tail, shared in (([6, 1, 2], 20), ([6, 3], 21), ([], 20)):
        tokens = PREFIX + tail
        cached, logits = warm(model, store, tokens, 4)
        assert cached == shared
        assert np.array_equal(logits, cold(model, tokens, 4, cached))
    cached, logits = warm(model, store, [*PREFIX[:12], 0, 0], 4)  # a KV cache is cut back to what is shared
    assert cached == 12 and np.array_equal(logits, cold(model, [*PREFIX[:12], 0, 0], 4, 12))
    assert store.hits == 4 and store.misses == 1


def test_a_recurrent_state_is_reused_only_at_a_cached_prompts_end(hybrid: LoadedModel) -> None:
    model, store = hybrid.model, PrefixCache()
    warm(model, store, PREFIX, 4)
    cached, logits = warm(model, store, [*PREFIX, 6, 1], 4)
    assert cached == len(PREFIX) and np.array_equal(logits, cold(model, [*PREFIX, 6, 1], 4, len(PREFIX)))
    cache = make_prompt_cache(model)
    reuse = store.restore(cache, [*PREFIX[:10], 0, 0, 0])
    assert reuse.cached == 0
    assert "10 tokens are shared with a cached prompt" in reuse.why_not and "recurrent" in reuse.why_not


def test_entries_and_bytes_stay_within_their_bounds() -> None:
    model, _ = tiny_llama(0)
    one = PrefixCache()
    warm(model, one, PREFIX, 4)
    size = one.nbytes
    store = PrefixCache(max_entries=3, max_bytes=int(2.5 * size))
    for first in range(5):  # five different prompts of PREFIX's length
        warm(model, store, [first, *PREFIX[1:]], 4)
        assert store.nbytes <= 2.5 * size and len(store) <= 3
    assert len(store) == 2  # the byte bound, not the entry bound, held here
    assert warm(model, store, [4, *PREFIX[1:]], 4)[0] == len(PREFIX)  # the most recent is kept
    assert warm(model, store, [0, *PREFIX[1:]], 4)[0] == 0  # the oldest went first
    assert PrefixCache(max_entries=3, max_bytes=size - 1).store(PREFIX, make_prompt_cache(model)) is None


def test_an_entry_is_reused_only_within_its_scope() -> None:
    model, _ = tiny_llama(0)
    store = PrefixCache()
    warm(model, store, PREFIX, 4, scope="coordinator-a")
    assert warm(model, store, [*PREFIX, 1], 4, scope="coordinator-b")[0] == 0
    assert warm(model, store, [*PREFIX, 1], 4, scope="coordinator-a")[0] == len(PREFIX)
