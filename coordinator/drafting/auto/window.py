"""The rounds ``--draft auto`` measures the current set-up over (``coordinator.drafting.auto.policy``).

``RoundWindow`` keeps the last ``size`` rounds of the current set-up since it
settled, and the round before them, whose end is where the window's time
starts. The policy reads it every round (its tok/s, the share of its time
spent waiting for drafts, its tokens a round), so it keeps running sums:
each read costs the same however long the window.
"""

from __future__ import annotations

from collections import deque


class RoundWindow:
    """The last ``size`` rounds of one set-up: their tokens, end times and waits for drafts."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._rounds: deque[tuple[int, int, int]] = deque()  # (tokens, end_ns, draft_ns), oldest first
        self._tokens = 0  # over every round held, the oldest (the start mark) included
        self._waited_ns = 0

    def append(self, tokens: int, end_ns: int, draft_ns: int) -> None:
        """One more round; the oldest beyond ``size`` + 1 goes."""
        self._rounds.append((tokens, end_ns, draft_ns))
        self._tokens += tokens
        self._waited_ns += draft_ns
        if len(self._rounds) > self.size + 1:
            old_tokens, _, old_waited = self._rounds.popleft()
            self._tokens -= old_tokens
            self._waited_ns -= old_waited

    def clear(self) -> None:
        """A new set-up: nothing measured yet."""
        self._rounds.clear()
        self._tokens = self._waited_ns = 0

    @property
    def full(self) -> bool:
        """Whether ``size`` rounds are held after the start mark."""
        return len(self._rounds) > self.size

    def tok_s(self) -> float | None:
        """Tokens a second over the window, once it is full."""
        seconds = self._elapsed_ns() / 1e9
        return self._measured_tokens() / seconds if self.full and seconds > 0 else None

    def waited_share(self) -> float:
        """The share of the window's time spent waiting for drafts (0 before it is full)."""
        elapsed = self._elapsed_ns()
        if not self.full or elapsed <= 0:
            return 0.0
        return min(1.0, (self._waited_ns - self._rounds[0][2]) / elapsed)

    def tokens_per_round(self) -> float:
        """Tokens a round over the rounds held after the start mark (1 before there are any)."""
        rounds = len(self._rounds) - 1
        return self._measured_tokens() / rounds if rounds > 0 else 1.0

    def _measured_tokens(self) -> int:
        return self._tokens - self._rounds[0][0] if self._rounds else 0

    def _elapsed_ns(self) -> int:
        return self._rounds[-1][1] - self._rounds[0][1] if self._rounds else 0
