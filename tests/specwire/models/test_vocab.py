"""The vocabulary fingerprint."""

from __future__ import annotations

import pytest

from specwire.errors import VocabularyMismatchError
from specwire.models.loading import LoadedModel
from specwire.models.vocab import ensure_same_vocabulary, vocabulary_fingerprint


class FakeVocab:
    """A minimal tokenizer surface: only what the fingerprint reads."""

    def __init__(self, tokens: list[str], bos: int | None, eos: int) -> None:
        self.tokens, self.bos_token_id, self.eos_token_id = tokens, bos, eos

    def __len__(self) -> int:
        return len(self.tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.tokens[i] for i in ids]


def test_fingerprint_is_stable_and_format_is_versioned(
    default_q4: LoadedModel, default_f32: LoadedModel
) -> None:
    assert default_q4.fingerprint == default_f32.fingerprint
    assert default_q4.fingerprint == vocabulary_fingerprint(default_q4.tokenizer)
    assert default_q4.fingerprint.startswith("v1:") and len(default_q4.fingerprint) == 19


def test_fingerprint_changes_with_any_token_or_special_id() -> None:
    base = vocabulary_fingerprint(FakeVocab(["a", "b", "c"], 0, 1))
    assert vocabulary_fingerprint(FakeVocab(["a", "b", "c"], 0, 1)) == base
    assert vocabulary_fingerprint(FakeVocab(["a", "b", "d"], 0, 1)) != base
    assert vocabulary_fingerprint(FakeVocab(["a", "c", "b"], 0, 1)) != base
    assert vocabulary_fingerprint(FakeVocab(["a", "b", "c"], None, 1)) != base
    assert vocabulary_fingerprint(FakeVocab(["a", "b", "c"], 0, 2)) != base
    # Token boundaries matter: "ab"+"c" is not "a"+"bc".
    assert vocabulary_fingerprint(FakeVocab(["ab", "c"], 0, 1)) != vocabulary_fingerprint(
        FakeVocab(["a", "bc"], 0, 1)
    )


def test_mismatch_names_both_fingerprints() -> None:
    ensure_same_vocabulary("v1:aaaa", "v1:aaaa", "t", "d")
    with pytest.raises(VocabularyMismatchError, match=r"v1:bbbb.*v1:aaaa"):
        ensure_same_vocabulary("v1:aaaa", "v1:bbbb", "target-x", "draft-y")
