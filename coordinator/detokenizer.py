"""Text from tokens as they come, equal in the end to decoding them all at once.

mlx-lm's streaming detokenizers drop the space a generation's first token
starts with, which changes a completion's text (" Paris" becomes "Paris").
``TextDecoder`` decodes a short window instead: the tokens since the last
text it gave out, against the same window without the newest token. What it
adds is the difference, held back while it ends in an incomplete UTF-8
character; every piece is what ``tokenizer.decode`` would add, so the pieces
join to ``tokenizer.decode(all tokens)``.
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

    def add(self, token: int) -> str:
        """The text ``token`` completes (empty while a character is still incomplete)."""
        self.tokens.append(token)
        before = self.tokenizer.decode(self.tokens[self._start : self._read])
        now = self.tokenizer.decode(self.tokens[self._start :])
        if len(now) <= len(before) or now.endswith(INCOMPLETE):
            return ""
        self._start, self._read = self._read, len(self.tokens)
        return str(now[len(before) :])

    def finish(self) -> str:
        """Whatever is still held back, once no token will follow."""
        before = self.tokenizer.decode(self.tokens[self._start : self._read])
        now = self.tokenizer.decode(self.tokens[self._start :])
        self._start = self._read = len(self.tokens)
        return str(now[len(before) :])
