"""Stop sequences over streamed text: emit what cannot start one, cut at the first match."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Finds the first stop sequence in text that arrives in pieces.

    ``feed`` returns the text safe to send now. It holds back the longest
    tail that could still grow into a stop sequence, so a match split across
    pieces is found and nothing past it is ever sent. After a match,
    ``stopped`` is True and the text before the match has been returned.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.stopped = False
        self._held = ""

    def feed(self, text: str) -> str:
        """The part of ``text`` (after what was held) that is sure to be output."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        text = self._held + text
        first = self._first(text)
        held_from = len(text) - partial_tail(text, self.stops)  # where a stop may still be arriving
        if first is not None and first <= held_from:
            self.stopped, self._held = True, ""
            return text[:first]
        # No match yet, or one after an earlier start that may still grow into a longer stop: hold that.
        self._held = text[held_from:]
        return text[:held_from]

    def flush(self) -> str:
        """What was held back, once no more text will come (cut at a stop it holds)."""
        held, self._held = self._held, ""
        first = self._first(held)
        if first is not None:
            self.stopped = True
            return held[:first]
        return held

    def _first(self, text: str) -> int | None:
        """Where the first stop sequence in ``text`` begins (None: none does)."""
        return min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=None)


def partial_tail(text: str, markers: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of one of ``markers`` (a marker may
    be arriving: hold that much back)."""
    longest = min(len(text), max((len(m) for m in markers), default=0) - 1)
    for n in range(longest, 0, -1):
        tail = text[-n:]
        if any(m.startswith(tail) for m in markers):
            return n
    return 0
