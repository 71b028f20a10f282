"""Text from tokens as they come, equal in the end to decoding them all at once.

mlx-lm's streaming detokenizers drop the space a generation's first token
starts with, which changes a completion's text (" Paris" becomes "Paris").
``TextDecoder`` decodes a short window instead: the tokens since the last
text it gave out, against the same window without the newest token. What it
adds is the difference, held back while it ends in an incomplete UTF-8
character. Where decoding is a concatenation of the tokens' texts (byte-level
BPE, as the default model's) every piece is what ``tokenizer.decode`` would
add, so the pieces join to ``tokenizer.decode(all tokens)``. Where decoding a
longer window rewrites earlier text (a tokenizer that cleans up spaces), it
re-anchors on the decode of everything so far, and gives what follows the
text already given out. (SentencePiece tokenizers drop a first token's
space in ``decode`` too, so there the pieces do as well.)
"""

from __future__ import annotations

from typing import Any

INCOMPLETE = "\ufffd"


class TextDecoder:
    """Incremental decoding of one generation's tokens with ``tokenizer.decode``."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self._start = 0  # first token of the decoding window
        self._read = 0  # tokens whose text has been given out
        self._given = 0  # characters given out

    def add(self, token: int) -> str:
        """The text ``token`` completes (empty while a character is still incomplete)."""
        self.tokens.append(token)
        before = self.tokenizer.decode(self.tokens[self._start : self._read])
        now = self.tokenizer.decode(self.tokens[self._start :])
        if len(now) <= len(before) or now.endswith(INCOMPLETE):
            return ""
        return self._give(before, now)

    def finish(self) -> str:
        """Whatever is still held back, once no token will follow."""
        before = self.tokenizer.decode(self.tokens[self._start : self._read])
        now = self.tokenizer.decode(self.tokens[self._start :])
        return self._give(before, now)

    def _give(self, before: str, now: str) -> str:
        self._start, self._read = self._read, len(self.tokens)
        if now.startswith(before):
            piece = str(now[len(before) :])
        else:  # decoding rewrote earlier text: what follows what was given, in the whole decode
            piece = str(self.tokenizer.decode(self.tokens)[self._given :])
        self._given += len(piece)
        return piece
