"""Grammars over a generation's output (llguidance): JSON schemas, any JSON object, forced tool calls.

A request's ``response_format`` (``json_object``, ``json_schema``) or a
forced tool call (``tool_choice`` ``required`` or a named function) becomes
a grammar here, checked when the request is read (a bad schema is refused
then, with llguidance's reason). Each run of the request gets a
``Grammar``, the ``Constraint`` that ``specwire.logits.processors``
applies: the mask of the tokens the grammar allows after the accepted output
and any suffix (a chain's drafts, a tree node's path), the matcher rolled
back and forward as the suffixes change, so a verification pass costs about
one consumption a position.

llguidance was chosen by measured mask cost and upkeep (docs/serving.md):
no dependencies, wheels for macOS arm64 and Linux, a grammar compiled in a
few milliseconds, and a mask in 10-30 µs a token on SmolLM2's 49,152-token
vocabulary. Its tokenizer view of a model is built once per model
(about a second) and shared.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specwire.errors import InvalidArgumentError

# Compact JSON, as a model writes it after ", " and ": " (free whitespace lets a weak model pad forever).
JSON_LAYOUT: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_tokenizers: dict[int, Any] = {}
_tokenizers_lock = threading.Lock()


def grammar_tokenizer(tokenizer: Any, vocab_size: int, eos: Sequence[int]) -> Any:
    """llguidance's view of a model's tokenizer (an mlx-lm ``TokenizerWrapper`` or a Hugging Face
    tokenizer), built once per tokenizer and shared."""
    import llguidance.hf

    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    with _tokenizers_lock:
        found = _tokenizers.get(id(hf))
        if found is None or found[0] is not hf:
            built = llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size, eos_token=sorted(eos))
            found = _tokenizers[id(hf)] = (hf, built)
    return found[1]


@dataclass(frozen=True)
class GrammarSpec:
    """A checked grammar (llguidance's serialized form), what it was made from (for messages), and the
    model's tokenizer as llguidance sees it."""

    grammar: str
    what: str
    lltokenizer: Any = field(repr=False, compare=False)

    def matcher(self) -> Grammar:
        """A fresh ``Grammar`` at the start of the output."""
        return Grammar(self)


def json_schema_grammar(schema: object, what: str, lltokenizer: Any) -> GrammarSpec:
    """The grammar of JSON that validates against ``schema`` (a dict); ``InvalidArgumentError`` naming
    ``what`` when llguidance cannot take it."""
    from llguidance import LLMatcher

    if not isinstance(schema, dict):
        raise InvalidArgumentError(f"{what} must be a JSON schema object")
    grammar = LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    return checked_grammar(grammar, what, lltokenizer)


def lark_grammar(lark: str, what: str, lltokenizer: Any) -> GrammarSpec:
    """A grammar in llguidance's Lark dialect (``%json {...}`` embeds a JSON schema)."""
    from llguidance import LLMatcher

    return checked_grammar(LLMatcher.grammar_from_lark(lark), what, lltokenizer)


def checked_grammar(grammar: str, what: str, lltokenizer: Any) -> GrammarSpec:
    """``grammar`` (llguidance's serialized form) for ``lltokenizer``'s model; ``InvalidArgumentError``
    naming ``what`` when the model cannot take it (a worker checks a coordinator's grammar here)."""
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(grammar, lltokenizer)
    if error:
        raise InvalidArgumentError(f"{what} cannot be used: {error.splitlines()[0][:300]}")
    return GrammarSpec(grammar, what, lltokenizer)


class Grammar:
    """One run's matcher: the ``Constraint`` of ``specwire.logits.processors``."""

    def __init__(self, spec: GrammarSpec) -> None:
        import llguidance.numpy as lln
        from llguidance import LLMatcher

        self.spec = spec
        lltokenizer = spec.lltokenizer
        self._matcher = LLMatcher(lltokenizer, spec.grammar, log_level=0)
        if self._matcher.is_error():
            raise InvalidArgumentError(f"{spec.what}: {self._matcher.get_error()[:300]}")
        self._vocab = lltokenizer.vocab_size
        self._eos = set(lltokenizer.eos_tokens)
        self._bitmask = lln.allocate_token_bitmask(1, self._vocab)
        self._fill = lln.fill_next_token_bitmask
        self._ahead: list[int] = []  # tokens consumed past the accepted output (of the suffix asked last)

    def allowed(self, suffix: Sequence[int]) -> np.ndarray | None:
        """Bool mask over the vocabulary after the accepted output and ``suffix``; None if ``suffix``
        breaks the grammar."""
        if not self._move_to(suffix):
            return None
        self._fill(self._matcher, self._bitmask)
        bits = np.unpackbits(self._bitmask[0].view(np.uint8), bitorder="little")[: self._vocab]
        return bits.view(np.bool_)

    def accept(self, tokens: Sequence[int]) -> None:
        """Extend the accepted output by ``tokens`` (a verified round's)."""
        if not self._move_to(tokens):
            raise InvalidArgumentError(f"{self.spec.what}: an accepted token breaks the grammar")
        self._ahead = []

    @property
    def done(self) -> bool:
        """Whether the grammar has ended (only end-of-sequence may follow, or nothing)."""
        return bool(self._matcher.is_stopped())

    def _move_to(self, suffix: Sequence[int]) -> bool:
        """Roll the matcher back to where ``suffix`` and the tokens consumed ahead part, then consume the
        rest of ``suffix``; False (having consumed what it allows) if a token of it is refused."""
        ahead = self._ahead
        common = 0
        while common < min(len(ahead), len(suffix)) and ahead[common] == suffix[common]:
            common += 1
        if common < len(ahead):
            self._matcher.rollback(len(ahead) - common)
            del ahead[common:]
        rest = [int(t) for t in suffix[common:]]
        if not rest:
            return True
        valid = self._matcher.validate_tokens(rest)  # checked first: a refused token breaks the matcher
        if valid and not self._matcher.consume_tokens(rest[:valid]):
            raise InvalidArgumentError(f"{self.spec.what}: {self._matcher.get_error()[:300]}")
        ahead.extend(rest[:valid])
        if valid < len(rest) and self._matcher.is_stopped() and rest[valid] in self._eos:
            return valid + 1 == len(rest)  # the grammar ended: its end-of-sequence is allowed, not consumed
        return valid == len(rest)
