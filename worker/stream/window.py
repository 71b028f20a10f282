"""When a tree session's verdict is expected: the clock a worker times its tree passes by.

The coordinator of a tree session says, as each verification starts, what it
verifies and how long after the worker's reply it started (``Verifying``:
its own drafting, on a miss). The verdict then comes about one verification
window later. The worker learns that window from the rounds it has seen
(from a reply to the next Round, less that delay) and expects the verdict at
their lower quartile; a pass that would end more than ``LATE_S`` after it is
not started, since the next window's first pass would wait for it. Until
the coordinator has said what it verifies, and a few windows were seen,
passes are not timed.
"""

from __future__ import annotations

from collections import deque

import numpy as np

WINDOWS = 16  # verification windows remembered
WINDOW_QUANTILE = 0.25  # of them: the verdict is expected this early
MIN_WINDOWS = 3  # windows seen before passes are timed by them
LATE_S = 1e-3  # a pass may end this long after the verdict is expected: the verdict waits for it


class VerdictClock:
    """One session's expected verdict (perf_counter seconds); see the module docstring. Its notes come
    from the event loop, its reads from the compute thread."""

    def __init__(self) -> None:
        self.told = False  # whether the coordinator says what it verifies
        self._replied_at: float | None = None  # when the latest reply was sent
        self._started_after = 0.0  # from that reply to its verification's start
        self._windows: deque[float] = deque(maxlen=WINDOWS)

    def replied(self, sent_ns: int) -> None:
        """A reply was handed to the transport at ``sent_ns`` (perf_counter ns)."""
        self._replied_at, self._started_after = sent_ns / 1e9, 0.0

    def verifying(self, started_after_ns: int) -> None:
        """The reply's verification started ``started_after_ns`` after it came (coordinator's clock)."""
        self.told, self._started_after = True, started_after_ns / 1e9

    def verdict(self, arrived_ns: int) -> None:
        """The verdict came off the stream at ``arrived_ns``: one more window."""
        if self._replied_at is not None:
            self._windows.append(arrived_ns / 1e9 - self._replied_at - self._started_after)
        self._replied_at = None

    def deadline(self) -> float | None:
        """When a pass must end by (None: passes are not timed yet)."""
        since = self._replied_at  # read once: the event loop may clear it
        if since is None or not self.told or len(self._windows) < MIN_WINDOWS:
            return None
        window = float(np.quantile(np.array(self._windows), WINDOW_QUANTILE))
        return since + self._started_after + window + LATE_S
