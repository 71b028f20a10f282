"""A move hands the local draft's context over (``auto``'s moves, ``keep_context``): the source a move starts
restores what the one it leaves had fed from the prompt cache they share, prefills only what follows, and
drafts what a source prefilled afresh drafts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.local import LocalDraftSource
from coordinator.drafting.local_tree import LocalTreeDraftSource, VerifyCurve
from specwire.drafting.prefix_cache import PrefixCache
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from tests.support.models.tiny_models import sampling_pair

PROMPT = [2, 5, 1, 7, 3, 9, 4]
CURVE = VerifyCurve((1, 64), (1.0, 1.0))  # positions cost nothing: trees as large as the draft allows
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def pair() -> tuple[LoadedModel, LoadedModel]:
    return sampling_pair()


def local_tree(draft: LoadedModel, cache: PrefixCache | None) -> LocalTreeDraftSource:
    return LocalTreeDraftSource(draft, CURVE, prefix_cache=cache)


def local_chain(draft: LoadedModel, cache: PrefixCache | None) -> LocalDraftSource:
    return LocalDraftSource(draft, cache)


@pytest.mark.parametrize("make", [local_tree, local_chain], ids=["local tree", "local chain"])
def test_a_move_hands_the_local_drafts_context_over(
    pair: tuple[LoadedModel, LoadedModel], make: Callable[[LoadedModel, PrefixCache | None], object]
) -> None:
    target, draft = pair
    cache = PrefixCache(4)
    leaving = make(draft, cache)
    decoding = SpeculativeDecoder(target, leaving).begin(PROMPT, max_tokens=64, k=4, params=GREEDY)  # type: ignore[arg-type]
    for _ in range(4):  # the last round's verdict is not yet applied, as at a move
        assert decoding.round()
    context = [*PROMPT, *decoding.result.tokens]
    before = cache.tokens_reused
    leaving.keep_context()  # type: ignore[attr-defined]

    taking_over, fresh = make(draft, cache), make(draft, None)
    for source in (taking_over, fresh):
        source.start(context, GREEDY, 4)  # type: ignore[attr-defined]
    reused = cache.tokens_reused - before
    last_round = decoding.result.rounds[-1].accepted + 1
    assert len(context) - 1 - last_round <= reused <= len(context) - 1  # all but the last verdict's tokens
    a, b = taking_over.propose(4, None), fresh.propose(4, None)  # type: ignore[attr-defined]
    assert a.tokens == b.tokens and a.tree == b.tree
    decoding.close()
