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
        starts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if starts:
            self.stopped, self._held = True, ""
            return text[: min(starts)]
        keep = partial_tail(text, self.stops)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What was held back, once no more text will come."""
        held, self._held = self._held, ""
        return held


def partial_tail(text: str, markers: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of one of ``markers`` (a marker may
    be arriving: hold that much back)."""
    longest = min(len(text), max((len(m) for m in markers), default=0) - 1)
    for n in range(longest, 0, -1):
        tail = text[-n:]
        if any(m.startswith(tail) for m in markers):
            return n
    return 0
