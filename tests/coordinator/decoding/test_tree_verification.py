"""Tree verification: every acceptance branch, and T = 0 output equal to AR at every tree size."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.decoding.acceptance import accept_tree_greedy, accept_tree_sampled
from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.local_tree import LocalTreeDraftSource, VerifyCurve
from specwire.drafting.sampling import SamplingParams
from specwire.drafting.token_tree import TokenTree
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel, load_model
from tests.support.models.tiny_models import disagreeing_pair
from tests.support.prompts import PROMPTS
from tests.support.rounding import assert_lossless

#      node: 0  1  2  3  4  5
# depth 1:   5  6            (children of the last verified token)
# depth 2:         7  8     3 (7, 8 under node 0; 3 under node 1)
# depth 3:               9   (under node 3)
TREE = TokenTree((5, 6, 7, 8, 9, 3), (-1, -1, 0, 0, 3, 1))


def choices(**rows: int) -> list[int]:
    """The target's argmax by row (``r0`` after the last verified token, ``rN`` after node N - 1)."""
    out = [0] * (len(TREE) + 1)
    for name, token in rows.items():
        out[int(name[1:])] = token
    return out


@pytest.mark.parametrize(
    ("rows", "path", "token"),
    [
        ({"r0": 4}, [], 4),  # the root's children all rejected: the correction alone
        ({"r0": 5, "r1": 1}, [0], 1),  # rejected at depth 2
        ({"r0": 5, "r1": 7, "r3": 2}, [0, 2], 2),  # a leaf at depth 2 accepted: its bonus
        ({"r0": 5, "r1": 8, "r4": 9, "r5": 2}, [0, 3, 4], 2),  # the deepest leaf: a whole path and its bonus
        ({"r0": 5, "r1": 8, "r4": 1}, [0, 3], 1),  # rejected at depth 3
        ({"r0": 6, "r2": 3, "r6": 1}, [1, 5], 1),  # the second sibling at depth 1, then its child
        ({"r0": 6, "r2": 7}, [1], 7),  # node 0's child's token is no child of node 1
    ],
)
def test_greedy_acceptance_follows_the_targets_choices(
    rows: dict[str, int], path: list[int], token: int
) -> None:
    assert accept_tree_greedy(choices(**rows), TREE) == (path, token)


def test_sampled_acceptance_with_certain_rows_is_greedy() -> None:
    rows = np.full((len(TREE) + 1, 10), -1e9)
    for row, token in enumerate(choices(r0=5, r1=8, r4=9, r5=2)):
        rows[row, token] = 0.0
    params = SamplingParams(temperature=0.7)
    assert accept_tree_sampled(rows, TREE, params, np.random.default_rng(0)) == ([0, 3, 4], 2)


def test_a_chain_is_a_tree() -> None:
    chain = TokenTree.chain([4, 5, 6])
    assert chain.is_chain() and chain.depths == (1, 2, 3) and chain.path(2) == [0, 1, 2]
    assert accept_tree_greedy([4, 5, 9, 9], chain) == ([0, 1], 9)
    assert not TREE.is_chain() and TREE.depth == 3


@pytest.fixture(scope="module")
def tiny_pair(tiny: LoadedModel) -> tuple[LoadedModel, LoadedModel]:
    return tiny, load_model("tiny-draft")


@pytest.mark.parametrize(
    ("nodes", "width", "k"), [(1, 1, 4), (2, 2, 1), (3, 2, 3), (8, 2, 4), (16, 4, 6), (48, 8, 8)]
)
def test_t0_output_equals_ar_at_every_tree_size(
    tiny_pair: tuple[LoadedModel, LoadedModel], nodes: int, width: int, k: int
) -> None:
    target, draft = tiny_pair
    params = SamplingParams()
    source = LocalTreeDraftSource(draft, None, nodes, width)
    decoder = SpeculativeDecoder(target, source)
    for prompt in PROMPTS[:2]:
        tokens = target.tokenizer.encode(prompt)
        ar = SpeculativeDecoder(target).generate(tokens, max_tokens=40, k=0, params=params)
        tree = decoder.generate(tokens, max_tokens=40, k=k, params=params)
        assert tree.tokens == ar.tokens
        assert max(source.sizes) <= nodes
        assert all(r.draft.tree is not None and r.draft.tree.depth <= r.k for r in tree.rounds if r.k)
    if nodes > 1:  # a tree accepts more a round than its first path alone would
        assert any(r.accepted > 0 for r in tree.rounds)


@pytest.mark.parametrize(("nodes", "width", "k"), [(4, 2, 3), (16, 4, 6)])
def test_t0_output_equals_ar_for_a_hybrid_target_verifying_trees(nodes: int, width: int, k: int) -> None:
    # Qwen3.5's layout (Gated DeltaNet and full attention), trees from a llama draft of the same vocabulary.
    # AR's output exactly on the CPU; a GPU may part from it only at a tie within its rounding.
    target, draft = load_model("tiny-hybrid"), load_model("tiny-draft")
    params = SamplingParams()
    source = LocalTreeDraftSource(draft, None, nodes, width)
    tokens = target.tokenizer.encode(PROMPTS[0])
    ar = SpeculativeDecoder(target).generate(tokens, max_tokens=32, k=0, params=params)
    tree = SpeculativeDecoder(target, source).generate(tokens, max_tokens=32, k=k, params=params)
    assert_lossless(target, tokens, ar.tokens, tree.tokens)
    assert tree.rollback is not None and tree.rollback.strategy == "states"
    assert max(source.sizes) > 1 and all(r.draft.tree is not None for r in tree.rounds if r.k)


def first_choice_depth(tree: TokenTree) -> int:
    """How deep the draft's first choices go in a local tree (a node's first child is its first choice)."""
    depth, node = 0, -1
    while True:
        child = next((i for i, p in enumerate(tree.parents) if p == node), None)
        if child is None:
            return depth
        depth, node = depth + 1, child


def test_a_hybrid_draft_drafting_for_itself_has_its_whole_first_choice_path_accepted() -> None:
    # Each node's Gated DeltaNet state continues its parent's, through passes a level at a time: were
    # any node's state not its path's, its first choice would differ from the same model's verdict.
    model = load_model("tiny-hybrid-draft")
    source = LocalTreeDraftSource(model, None, 8, 2)
    tokens = model.tokenizer.encode(PROMPTS[1])
    result = SpeculativeDecoder(model, source).generate(tokens, max_tokens=40, k=4, params=SamplingParams())
    ar = SpeculativeDecoder(model).generate(tokens, max_tokens=40, k=0, params=SamplingParams())
    assert result.tokens == ar.tokens
    full = [r for r in result.rounds[:-1] if r.draft.tree is not None]  # the last may stop at max_tokens
    assert full and all(r.accepted == first_choice_depth(r.draft.tree) for r in full)
    assert max(r.accepted for r in full) >= 3


def test_t0_output_equals_ar_with_a_draft_that_disagrees_at_every_depth() -> None:
    target, draft = disagreeing_pair()
    params = SamplingParams()
    prompt = [2, 5, 1]
    ar = SpeculativeDecoder(target).generate(prompt, max_tokens=60, k=0, params=params)
    for nodes, width in [(4, 2), (8, 8)]:
        source = LocalTreeDraftSource(draft, None, nodes, width)
        result = SpeculativeDecoder(target, source).generate(prompt, max_tokens=60, k=5, params=params)
        assert result.tokens == ar.tokens
        accepted = {r.accepted for r in result.rounds}
        assert 0 in accepted and max(accepted) >= 2  # rejected at the root and deeper down


def test_the_tree_size_follows_the_verification_curve(tiny_pair: tuple[LoadedModel, LoadedModel]) -> None:
    """Where a position costs a pass, trees shrink to what pays; where positions are free, they fill up."""
    target, draft = tiny_pair
    tokens = target.tokenizer.encode(PROMPTS[0])
    sizes = {}
    for name, seconds in [("flat", (1.0, 1.0, 1.0)), ("linear", (1.0, 16.0, 32.0))]:
        curve = VerifyCurve((1, 16, 32), seconds)
        source = LocalTreeDraftSource(draft, curve, 16, 4)
        SpeculativeDecoder(target, source).generate(tokens, max_tokens=30, k=6, params=SamplingParams())
        sizes[name] = float(np.mean(source.sizes))
    assert sizes["flat"] >= 12 and sizes["linear"] <= 4, sizes


def test_a_tree_deeper_than_the_round_is_refused(tiny_pair: tuple[LoadedModel, LoadedModel]) -> None:
    target, _ = tiny_pair

    class TooDeep:
        name = "too-deep"

        def start(self, prompt, params, k):  # type: ignore[no-untyped-def]
            pass

        def propose(self, k, outcome):  # type: ignore[no-untyped-def]
            from specwire.drafting.draft_block import DraftBlock

            return DraftBlock([1] * (k + 1), None, 0, 0, tree=TokenTree.chain([1] * (k + 1)))

        def close(self) -> None:
            pass

    with pytest.raises(InvalidArgumentError, match="4 deep; this round takes 3"):
        SpeculativeDecoder(target, TooDeep()).generate([1, 2], max_tokens=10, k=3, params=SamplingParams())
