"""How ``--draft auto`` judges its tries: against the set-up they left, measured on both sides of them.

A try's window comes later in the text than the window of the set-up it
left (the incumbent), and a text's tokens a round move as it goes on (the
paper preset's code prompt: 2.36 → 3.00 from its first quarter to its last
under local tree SD), so a try measured later reads faster. After a run of
tries auto goes back to the incumbent for one more window (the second
look), and each tried set-up is ranked by its window's ratio to the mean of
the incumbent's windows on both sides of the run (A, B, C, A); its session's
share is set to its ratio to the better of those windows, against the
incumbent's, so that a later generation starts on it only if it led both
(27B profile, 2026-11-29: a try not kept led the next generation's start
onto it, on a harder prompt, at 0.83-0.87 of the incumbent). A run of tries begins
only where the generation has room for it and its second look
(``AutoDraftSource``), and tries a generation ends before their second look
settled are forgotten. Carrying such a look into the next generation
compared windows of two texts: in a 0967b21 run (measurements.md) the next
prompt was harder, the incumbent read as slower, and the tries were kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.planning.planner import Planner, Session, session_of
from coordinator.planning.setups import Predicted, Setup

Window = tuple[Setup, float]  # a set-up, and the tok/s a window of its rounds measured


@dataclass(frozen=True)
class Look:
    """A run of tries waiting for the set-up they left (the incumbent) to be measured again: each try's
    window, and the incumbent's before the run."""

    tried: dict[Session, Window]
    before: Window

    def windows(self) -> str:
        """The tries' windows, for a reason or a log line."""
        return ", ".join(f"{setup.label} {tok_s:.1f}" for setup, tok_s in self.tried.values())


class Tries:
    """The tries of one generation at a time and their second look (module docstring)."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self.before: Window | None = None  # the set-up the run of tries left, and its last window
        self.tried: dict[Session, Window] = {}  # by session: its try's window
        self.look: Look | None = None  # the run waiting for the incumbent's second window

    def begin(self, incumbent: Setup, measured: float | None) -> None:
        """A run of tries leaves ``incumbent``, whose last window measured ``measured``."""
        self.before = (incumbent, measured) if measured is not None else None

    def measured(self, setup: Setup, tok_s: float) -> None:
        """A try's window."""
        self.tried[session_of(setup)] = (setup, tok_s)

    def second_look(self, chosen: Setup, lost: set[str]) -> Look | None:
        """After a run of tries that would end on ``chosen``: the look to take on the incumbent (None: the
        run has no incumbent to go back to, or ``chosen`` is neither it nor a try)."""
        before, tried = self.before, self.tried
        self.before, self.tried = None, {}
        if before is None or not tried:
            return None
        incumbent = before[0]
        if incumbent.worker in lost or session_of(chosen) not in {*tried, session_of(incumbent)}:
            return None
        self.look = Look(tried, before)
        return self.look

    def settle(self, current: Setup, ranking: list[Predicted], measured: float) -> list[Window]:
        """The incumbent (``current``) measured ``measured`` again: each try's ratio to the mean of its two
        windows, best first; each try's share is set to its ratio to the better of them against the
        incumbent's."""
        assert self.look is not None
        look, self.look = self.look, None
        reference = (look.before[1] + measured) / 2
        better = max(look.before[1], measured)  # what a later generation's start compares it with
        predicted = {p.setup: p.tok_s for p in ranking}
        mine = self.planner.share(session_of(current))
        ratios = []
        for setup, tok_s in look.tried.values():
            ratio = tok_s / reference
            if mine is not None and predicted.get(setup, 0.0) > 0 and predicted.get(current, 0.0) > 0:
                share = tok_s / better * mine.value * predicted[current] / predicted[setup]
                self.planner.rescale(session_of(setup), share)
            ratios.append((setup, ratio))
        return sorted(ratios, key=lambda w: -w[1])

    def end(self) -> None:
        """The generation ended: tries it ended before their second look settled are forgotten (a try is
        judged against the incumbent on the same text, or not at all), and set-ups never measured are
        expected at the incumbent's share again."""
        look = self.look
        tried = {**self.tried, **(look.tried if look is not None else {})}
        before = self.before if self.before is not None else look.before if look is not None else None
        for session in tried:
            self.planner.forget(session)
        kept = self.planner.share(session_of(before[0])) if before is not None and tried else None
        if kept is not None:
            self.planner.bias = kept.value
        self.before, self.tried, self.look = None, {}, None

    def drop(self) -> None:
        """A worker was lost mid-run: the run ends unjudged."""
        self.before, self.tried, self.look = None, {}, None


def lead_needed(setup: Setup, incumbent: Setup, margin: float, start_margin: float) -> float:
    """How far ``setup`` must lead ``incumbent`` to be kept: ``margin`` (the policy's ``MARGIN``) for a
    worker's set-up over one without a worker, else ``start_margin`` (``START_MARGIN``)."""
    return margin if setup.remote and not incumbent.remote else start_margin


def kept_after_look(
    ratios: Sequence[tuple[Setup, float]],
    incumbent: Setup,
    lost: set[str],
    margin: float,
    start_margin: float,
) -> tuple[Setup, float] | None:
    """Of the tries' ratios to the incumbent's windows around them (best first), the one to move to.

    The best that leads by ``margin`` for a worker's set-up over an incumbent without one, else by
    ``start_margin`` (the policy's ``MARGIN`` and ``START_MARGIN``); but a try without a worker that also
    leads, if within ``margin`` of a worker's, as the policy's start keeps it (``_choice``). None: stay.
    On the paper's preset (test bed, 2026-11-29) auto left tree verification, tried the M1 Max's tree
    (1.10) and local tree SD (1.06), and kept the worker's tree, where the next generation's start went
    to local tree SD.
    """
    leading = [
        (setup, ratio)
        for setup, ratio in ratios
        if ratio > 1 + lead_needed(setup, incumbent, margin, start_margin) and setup.worker not in lost
    ]
    if not leading:
        return None
    best = leading[0]
    here = next((w for w in leading if not w[0].remote), None)
    if best[0].remote and here is not None and here[1] * (1 + margin) >= best[1]:
        return here
    return best
