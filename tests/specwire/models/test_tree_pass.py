"""A pass over a tree leaves, for the path kept, exactly what a chain pass over that path leaves."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from coordinator.decoding.rollback import Rollback
from specwire.drafting.drafter import prefill
from specwire.drafting.token_tree import TokenTree
from specwire.errors import InvalidArgumentError, UnsupportedModelError
from specwire.models.loading import LoadedModel, load_model
from tests.support.rounding import PassRounding, assert_caches_within, assert_logits_within, backend_rounding

PROMPT = [1, 504, 3458, 282, 260, 2113, 314, 30]  # any tokens do: the check is the cache, not the text


def random_tree(rng: np.random.Generator, nodes: int, vocab: int) -> TokenTree:
    tokens: list[int] = []
    parents: list[int] = []
    while len(tokens) < nodes:
        parent = int(rng.integers(-1, len(tokens)))
        token = int(rng.integers(0, vocab))
        if (parent, token) in zip(parents, tokens, strict=True):
            continue
        tokens.append(token)
        parents.append(parent)
    return TokenTree(tuple(tokens), tuple(parents))


def verified(model: LoadedModel, fed: list[int], tree: TokenTree | None, path: list[int]):
    """Logits and cache after verifying ``tree`` (or the chain ``path``) after ``fed``, keeping ``path``."""
    cache = make_prompt_cache(model.model)
    rollback = Rollback(model.model, cache, len(fed) - 1)
    prefill(model.model, cache, fed[:-1])
    if tree is None:
        logits = rollback.verify([fed[-1], *path])[0]
        rollback.keep_first(len(path) + 1)
        rows = logits
    else:
        logits = rollback.verify_tree(fed[-1], tree)[0]
        rollback.keep_path(path)
        rows = logits[mx.array([0, *(node + 1 for node in path)])]
    return rows, cache


@pytest.mark.parametrize("seed", range(6))
def test_a_tree_pass_keeps_what_a_chain_pass_over_the_accepted_path_keeps(
    tiny: LoadedModel, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, int(rng.integers(1, 24)), tiny.vocab_size)
    node = int(rng.integers(-1, len(tree)))
    path = tree.path(node)
    tokens = [tree.tokens[i] for i in path]
    tree_rows, tree_cache = verified(tiny, PROMPT, tree, path)
    chain_rows, chain_cache = verified(tiny, PROMPT, None, tokens)
    assert np.array_equal(np.array(tree_rows), np.array(chain_rows))  # bit for bit
    for a, b in zip(tree_cache, chain_cache, strict=True):
        assert a.offset == b.offset == len(PROMPT) + len(path)
        for x, y in zip(a.keys_and_values(), b.keys_and_values(), strict=True):
            assert np.array_equal(np.array(x), np.array(y))
    # and the next pass over either cache gives the same logits
    after = [int(rng.integers(0, tiny.vocab_size))]
    assert np.array_equal(
        np.array(tiny.model(mx.array([after]), cache=tree_cache)),
        np.array(tiny.model(mx.array([after]), cache=chain_cache)),
    )


def test_the_real_model_keeps_the_same_cache_through_a_tree(default_f32: LoadedModel) -> None:
    """The default target (SmolLM2, 30 layers, GQA): a bushy tree of 12 nodes, a path 3 deep kept.

    Bit for bit on the CPU; a GPU rounds the tree's 13-row pass and the chain's 5-row pass apart, so
    there they agree within the rounding measured for passes as wide (tests/support/rounding.py)."""
    tree = TokenTree(
        (11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122, 133), (-1, -1, -1, 0, 0, 1, 3, 3, 6, 5, 2, 8)
    )
    path = tree.path(9 - 1)  # nodes 0, 3, 6, 8
    tokens = [tree.tokens[i] for i in path]
    rounding = as_wide_as(default_f32, tree, tokens)
    tree_rows, tree_cache = verified(default_f32, PROMPT, tree, path)
    chain_rows, chain_cache = verified(default_f32, PROMPT, None, tokens)
    assert_logits_within(tree_rows, chain_rows, rounding, "the path's rows")
    assert_caches_within(tree_cache, chain_cache, rounding)


def as_wide_as(model: LoadedModel, tree: TokenTree, tokens: list[int]) -> PassRounding:
    """This backend's rounding for a pass as wide as the tree's and one as wide as the chain's (the
    tree's tokens in order stand in for it): exact on the CPU."""
    return backend_rounding(
        model, [(PROMPT + list(tree.tokens), len(tree) + 1), (PROMPT + tokens, len(tokens) + 1)]
    )


@pytest.mark.parametrize(
    ("tokens", "parents", "says"),
    [
        ((1, 2), (-1,), "one parent per token"),
        ((1, 2), (-1, 1), "must be an earlier node"),  # a node its own parent: a cycle
        ((1, 2), (-1, 5), "must be an earlier node"),
        ((1, 2), (-1, -2), "must be an earlier node"),
        ((7, 7), (-1, -1), "siblings with the same token"),
    ],
)
def test_a_malformed_tree_is_refused(tokens: tuple[int, ...], parents: tuple[int, ...], says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        TokenTree(tokens, parents)


def test_a_tree_too_large_too_deep_or_outside_the_vocabulary_is_refused() -> None:
    tree = TokenTree.chain([5, 6, 7])
    tree.check(vocab_size=10, max_nodes=3, max_depth=3)
    for kwargs, says in [
        ({"vocab_size": 10, "max_nodes": 2, "max_depth": 3}, "at most 2"),
        ({"vocab_size": 10, "max_nodes": 3, "max_depth": 2}, "3 deep"),
        ({"vocab_size": 7, "max_nodes": 3, "max_depth": 3}, "outside a vocabulary of 7"),
    ]:
        with pytest.raises(InvalidArgumentError, match=says):
            tree.check(**kwargs)


@pytest.fixture(scope="module")
def tiny_hybrid() -> LoadedModel:
    return load_model("tiny-hybrid")


@pytest.mark.parametrize("seed", range(6))
def test_a_hybrid_tree_pass_keeps_what_a_chain_pass_over_the_accepted_path_keeps(
    tiny_hybrid: LoadedModel, seed: int
) -> None:
    # Qwen3.5's layout: every node's Gated DeltaNet window and state continue its own parent's. Bit for
    # bit on the CPU; on a GPU within the rounding of passes as wide (the convolution and delta rule too).
    rng = np.random.default_rng(100 + seed)
    tree = random_tree(rng, int(rng.integers(1, 24)), tiny_hybrid.vocab_size)
    node = int(rng.integers(-1, len(tree)))
    path = tree.path(node)
    tokens = [tree.tokens[i] for i in path]
    rounding = as_wide_as(tiny_hybrid, tree, tokens)
    tree_rows, tree_cache = verified(tiny_hybrid, PROMPT, tree, path)
    chain_rows, chain_cache = verified(tiny_hybrid, PROMPT, None, tokens)
    assert_logits_within(tree_rows, chain_rows, rounding, "the path's rows")
    assert_caches_within(tree_cache, chain_cache, rounding)
    after = [int(rng.integers(0, tiny_hybrid.vocab_size))]
    assert_logits_within(
        tiny_hybrid.model(mx.array([after]), cache=tree_cache),
        tiny_hybrid.model(mx.array([after]), cache=chain_cache),
        rounding,
        "the next pass's logits",
    )


def test_a_recurrent_model_that_keeps_no_per_position_states_is_refused_by_architecture() -> None:
    hybrid = load_model("tiny-hybrid")
    cache = make_prompt_cache(hybrid.model)
    rollback = Rollback(hybrid.model, cache, len(PROMPT) - 1, strategy="replay")
    prefill(hybrid.model, cache, PROMPT[:-1])
    with pytest.raises(UnsupportedModelError, match=r"qwen3_5.* so it drafts and verifies chains"):
        rollback.verify_tree(PROMPT[-1], TokenTree.chain([5, 6]))
