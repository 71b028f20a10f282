"""Incremental decoding joins to decoding everything at once, leading spaces and split characters included."""

from __future__ import annotations

import numpy as np

from coordinator.detokenizer import TextDecoder
from specwire.models.loading import LoadedModel


def pieces_of(tiny: LoadedModel, ids: list[int]) -> list[str]:
    decoder = TextDecoder(tiny.tokenizer)
    return [decoder.add(t) for t in ids] + [decoder.finish()]


def test_pieces_join_to_the_whole_decode(tiny: LoadedModel) -> None:
    rng = np.random.default_rng(7)
    for _ in range(100):
        ids = rng.integers(0, tiny.vocab_size, size=int(rng.integers(1, 40))).tolist()
        assert "".join(pieces_of(tiny, ids)) == tiny.tokenizer.decode(ids)


def test_a_leading_space_is_kept(tiny: LoadedModel) -> None:
    ids = list(tiny.tokenizer.encode(" Paris is"))
    assert pieces_of(tiny, ids)[0] == " Paris"  # mlx-lm's streaming detokenizer gives "Paris"


def test_a_character_split_over_tokens_comes_out_whole(tiny: LoadedModel) -> None:
    ids = list(tiny.tokenizer.encode("a \u2603 snowman"))  # byte-level BPE splits the snowman
    pieces = [p for p in pieces_of(tiny, ids) if p]
    assert "\ufffd" not in "".join(pieces)
    assert any("\u2603" in p for p in pieces) and "".join(pieces) == "a \u2603 snowman"
