"""What ``--draft auto`` expects each set-up to give now (``coordinator.drafting.auto.policy``).

Every set-up is expected at its prediction times its session's measured
share (the planner keeps each session's moving mean across generations),
times how the text runs now (the current window's share over its session's
mean): set-ups are compared as they measured, not as the text happened to
run when each was measured. A session never measured is expected at its
mode's share on another worker, else at the current one's share. A worker
whose set-up measured below ``SLOW`` of its prediction, where the wait for
its drafts explains the shortfall, has every set-up of its own expected at
that share for ``SLOW_ROUNDS`` (what slowed one, its link or its compute,
slows all), or until a set-up of its measures a window that is not slow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from coordinator.planning.planner import Planner, session_of
from coordinator.planning.setups import Predicted, Setup

log = logging.getLogger(__name__)

SLOW = 0.7  # a worker's set-up measuring below this share of its prediction marks the worker slow
SLOW_ROUNDS = 64  # rounds after which a worker marked slow is expected at its sessions' shares again


@dataclass
class _Seen:
    """The share a worker's set-up measured when it was marked slow, and at which round."""

    tok_s: float
    round: int


class Expectations:
    """Each set-up's expected tok/s now, from the planner's shares and the current window (module
    docstring)."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self.slow: dict[str, _Seen] = {}  # by worker: the share of a set-up of its that measured slow
        self.text = 1.0  # the current window's share over its session's mean: how the text runs now

    def reset(self) -> None:
        """A new generation: no worker slow, the text as the shares say."""
        self.slow, self.text = {}, 1.0

    def expected(self, p: Predicted, round: int) -> float:
        """The tok/s ``p``'s set-up is expected to give at ``round``: its prediction times its session's
        share (else the share last measured) times how the text runs now; a slow worker's, its share."""
        slow = self.slow.get(p.setup.worker)
        if slow is not None and round - slow.round < SLOW_ROUNDS:
            return p.tok_s * slow.tok_s
        share = self.share(p.setup)
        return p.tok_s * (share if share is not None else self.planner.bias) * self.text

    def share(self, setup: Setup) -> float | None:
        """The session's measured share, else its mode's on another worker (the planner ranks workers
        by their pass curves and links, which it measured; what it misjudges is the mode)."""
        own = self.planner.share(session_of(setup))
        if own is not None or not setup.remote:
            return own.value if own is not None else None
        shares = (self.planner.share(key) for key in list(self.planner.shares) if key[0] == setup.mode)
        kin = [s for s in shares if s is not None]
        return max(kin, key=lambda s: s.windows).value if kin else None

    def untried(self, p: Predicted) -> bool:
        """A session no generation under this planner has measured, nor its mode on another worker, on a
        worker not marked slow."""
        return self.share(p.setup) is None and p.setup.worker not in self.slow

    def learn(self, current: Setup, window: float, waited: float, round: int) -> None:
        """``current``'s window measured ``window`` of its prediction, ``waited`` of its time waiting for
        drafts: into its session's share, and either the worker is marked slow or the text moved."""
        mean = self.planner.learn(session_of(current), window).value
        # A worker is slow only if waiting for it explains the shortfall. The window is the rest's share
        # (were the wait gone) times the share of the time not spent waiting: the worker is at fault
        # where the rest alone reaches SLOW, or where the wait is the larger of the two factors (a
        # loaded coordinator slows its own part too: measured, 0.06 of the prediction with 0.90 of it
        # waiting). Otherwise the window fell with the text (fewer tokens a round for any drafter: a
        # worker's tree served from its cache waits about nothing), and every set-up falls with it.
        unwaited = max(1e-9, 1 - waited)
        worker_fault = window / unwaited >= min(SLOW, unwaited)
        log.debug(
            "round %d: %s measured %.2f of its prediction, %.2f of it waiting for drafts",
            round,
            current.label,
            window,
            waited,
        )
        if current.remote and window < SLOW and worker_fault:
            self.slow[current.worker] = _Seen(window, round)
        else:
            self.text, self.planner.bias = (window / mean if mean > 0 else 1.0), mean
            if current.remote:  # measured as it should again: what slowed it has passed
                self.slow.pop(current.worker, None)
