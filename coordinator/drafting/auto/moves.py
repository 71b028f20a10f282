"""The sessions ``--draft auto`` moves between within one generation (``coordinator.drafting.auto``).

``Moves`` owns every draft session a generation opens: the current one, a
worker's session opening ahead while the current set-up decodes, and the
sessions on this machine that a move left, kept to be caught up rather than
prefilled again. It makes each move the policy decides, keeps each with its
reason (``Switch``) and the rounds each set-up served (``Segment``), and
turns a worker lost at any point (opening, opening ahead, mid-round) into
the loss of its set-ups, never of a round. It calls back into the policy
(``Policy``) for what only the policy knows: the best set-up left, and what
a move or a loss does to its measurements.

A move to a worker's fill session (a worker's tree, tree verification) is
opened ahead: the worker prefills the context while the current set-up goes
on, and the move is made at the first round end after the worker answered;
that round's Round catches the session up on every token decoded since
(``Outcome.catch_up``). A kept session on this machine is caught up the
same way when the generation comes back to it. Before any move, the
current set-up's local draft keeps its cache at the context in the prompt
cache all of the generation's local drafts share, so a session the move
starts prefills only the tokens after it (``_hand_over``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from coordinator.drafting.auto.report import Segment, Switch
from coordinator.drafting.base import CatchesUp, DraftSource, Outcome, close_soon, offer_processing
from coordinator.drafting.failover import abandon
from coordinator.planning.planner import session_of
from coordinator.planning.setups import Setup
from specwire.drafting.drafter import DraftBlock
from specwire.drafting.sampling import SamplingParams
from specwire.errors import RemoteWorkerError, SpecwireError
from specwire.logits.processors import Processing

log = logging.getLogger(__name__)


class Policy(Protocol):
    """What ``Moves`` asks of the drafting policy."""

    def next_best(self) -> Setup:
        """The set-up to move to now that a worker is lost (the best left)."""
        ...

    def moved(self) -> None:
        """A move was made: the new set-up's measurements start afresh."""
        ...

    def worker_lost(self, opening_ahead: bool) -> None:
        """A worker was lost mid-round, or (``opening_ahead``) while its session opened ahead."""
        ...


@dataclass
class _Ahead:
    """A set-up whose worker session opens while the current set-up decodes, and why it was chosen."""

    setup: Setup
    source: DraftSource
    reason: str
    since: int  # the context's length when it opened: the tokens after it are its catch-up
    round: int  # the round it opened at


class Moves:
    """One generation's sessions and the moves between them (module docstring)."""

    def __init__(self, build: Callable[[Setup], DraftSource | None], policy: Policy) -> None:
        self.build = build
        self.policy = policy
        self.current = Setup("ar")
        self.source: DraftSource | None = None
        self.switches: list[Switch] = []
        self.segments: list[Segment] = []
        self.lost: set[str] = set()  # workers lost in this generation
        self.processing: Processing | None = None  # the request's penalties and grammar
        self.context: list[int] = []
        self.round = 0
        self._params = SamplingParams()
        self._last_tokens = 0  # the last round's tokens
        self._fresh = True  # the current session has seen no verdict yet
        self._started = time.perf_counter()
        self._ahead: _Ahead | None = None  # a session opening while the current set-up decodes
        self._parked: dict[tuple[str, str], tuple[DraftSource, int]] = {}  # left sessions here, by session
        self._catch_up: int | None = None  # the next propose catches the session up from this length

    def begin(self, prompt: Sequence[int], params: SamplingParams) -> None:
        """A new generation: no session yet (AR), nothing moved, nothing lost."""
        self._drop_ahead()
        self._close_parked()
        self.context, self.round, self._params = list(prompt), 0, params
        self.switches, self.segments, self.lost = [], [], set()
        self.current, self.source, self._catch_up = Setup("ar"), None, None
        self._started = time.perf_counter()

    @property
    def opening_ahead(self) -> bool:
        """Whether a move waits for a worker's session opening ahead (``await_ahead``)."""
        return self._ahead is not None

    def advance(self, tokens: Sequence[int]) -> None:
        """One round finished with ``tokens``."""
        self.context += tokens
        self._last_tokens = len(tokens)
        self.round += 1

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Draft on the current session; a worker lost on the way costs its set-up, never the round."""
        while self.source is not None:
            if self._fresh:  # a new session starts from the whole context: no verdict to apply
                outcome, self._fresh = None, False
            if self._catch_up is not None:  # opened ahead or kept: every token decoded since
                caught, self._catch_up = self.context[self._catch_up :], None
                outcome = Outcome(len(caught) - 1, caught[-1], tuple(caught), catch_up=True)
            try:
                return self.source.propose(k, outcome)
            except RemoteWorkerError as err:
                self._lose(err)
        return DraftBlock([], None, 0, 0)

    def enter(self, setup: Setup, reason: str, ahead: bool = False) -> None:
        """Close the current session and open ``setup``'s from the whole context; a worker that fails to
        open costs its set-ups, and the next best is opened instead. ``ahead``: a session that can be
        caught up is opened while the current set-up goes on decoding (``_open_ahead``), and a set-up on
        this machine that the move leaves is kept."""
        self._hand_over()
        built: DraftSource | None = None
        if ahead and setup.remote:
            built = self.build(setup)
            if isinstance(built, CatchesUp):
                self._open_ahead(setup, built, reason)
                return
        while True:
            segment = self._move(setup, reason, park=ahead)
            parked = self._parked.pop(session_of(setup), None)
            if parked is not None:  # left earlier in this generation: caught up, not prefilled again
                segment.source = self.source = parked[0]
                self._fresh, self._catch_up = False, parked[1]
                return
            source, built = built, None
            try:
                source = source if source is not None else self.build(setup)
                if source is not None:
                    offer_processing(source, self.processing)
                    source.start(self.context, self._params, setup.k)
            except RemoteWorkerError as err:
                segment.lost, segment.source = True, source
                self._mark_lost(setup.worker, source, err)
                setup, reason = self.policy.next_best(), f"worker {setup.worker} lost ({err.code}: {err})"
                continue
            segment.source = self.source = source
            return

    def switch_k(self, setup: Setup, reason: str) -> None:
        """The same session at another k: nothing to reopen."""
        self._note(setup, reason)
        self.current = setup

    def await_ahead(self) -> None:
        """Move to the session opening ahead once its worker has answered the Open; its first round
        catches it up on the tokens decoded since."""
        ahead = self._ahead
        assert ahead is not None and isinstance(ahead.source, CatchesUp)
        try:
            if not ahead.source.arrived():
                return
            self._ahead = None
            waited = self.round - ahead.round
            segment = self._move(
                ahead.setup, f"{ahead.reason}; opened ahead, {waited} rounds before", park=True
            )
            segment.source = self.source = ahead.source
            self._fresh = False
            # The Open's drafts, for the context it opened with: superseded by the catch-up, never verified.
            segment.opened = ahead.source.propose(ahead.setup.k, None)
            self._catch_up = ahead.since
        except RemoteWorkerError as err:
            if self.source is ahead.source:  # lost as the move was made: as a loss mid-round
                self._lose(err)
            else:
                self._lose_ahead(ahead, err)

    def close(self) -> None:
        """End the current session, one opening ahead, and those kept on this machine."""
        self._drop_ahead()
        self._leave()
        self._close_parked()

    def _open_ahead(self, setup: Setup, source: DraftSource, reason: str) -> None:
        """Open ``setup``'s session from the context so far and go on decoding on the current set-up; the
        move is made once the worker has answered (``await_ahead``)."""
        ahead = _Ahead(setup, source, reason, len(self.context), self.round)
        try:
            offer_processing(source, self.processing)
            source.start(self.context, self._params, setup.k)
        except RemoteWorkerError as err:
            self._lose_ahead(ahead, err)
            return
        self._ahead = ahead
        log.info("drafting: opening %s ahead (%s)", setup.label, reason)

    def _hand_over(self) -> None:
        """Before a move: the current set-up's local draft keeps its cache at the context so far in the
        prompt cache every set-up's local draft shares, so a session the move starts prefills only the rest
        (a paced M2 Ultra's draft took 24 ms of a round to prefill 116 tokens again on the paper's test
        bed)."""
        keep = getattr(self.source, "keep_context", None)
        if keep is not None:
            keep()

    def _lose_ahead(self, ahead: _Ahead, err: RemoteWorkerError) -> None:
        """A worker lost while its session opened ahead: its set-ups go, and the current one goes on."""
        self._ahead = None
        self.policy.worker_lost(opening_ahead=True)
        self.segments.append(Segment(ahead.setup, ahead.source, self.round, self.round - 1, lost=True))
        self._mark_lost(ahead.setup.worker, ahead.source, err, " opening its session ahead")

    def _drop_ahead(self) -> None:
        """End a session still opening ahead (the generation ended, or the current worker was lost)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            _close(ahead.source)

    def _lose(self, err: RemoteWorkerError) -> None:
        """The current worker failed mid-round: drop it and move to the best set-up without it."""
        self._drop_ahead()
        self._catch_up = None
        self.policy.worker_lost(opening_ahead=False)
        lost = self.current
        self.segments[-1].lost = True
        self.segments[-1].source = self.source
        self._mark_lost(lost.worker, self.source, err)
        self.source = None
        self.enter(self.policy.next_best(), f"worker {lost.worker} lost ({err.code}: {err})")

    def _move(self, setup: Setup, reason: str, park: bool) -> Segment:
        """Leave the current set-up (``_leave``) for ``setup``, noted with ``reason``; its segment, whose
        source the caller sets."""
        self._leave(park)
        self._note(setup, reason)
        self.current, self._fresh = setup, True
        self.policy.moved()
        segment = Segment(setup, None, self.round)
        self.segments.append(segment)
        return segment

    def _mark_lost(
        self, worker: str, source: DraftSource | None, err: RemoteWorkerError, how: str = ""
    ) -> None:
        """``worker`` failed: its session dropped at once, and its set-ups out for this generation."""
        abandon(source)
        self.lost.add(worker)
        log.warning("lost worker %s (%s)%s: %s", worker, err.code, how, err)

    def _leave(self, park: bool = False) -> None:
        """End the current session; ``park`` (a move mid-generation): a set-up on this machine is kept
        instead, and caught up if the generation comes back to it (its draft model holds the context: no
        prefill again), and a worker's session is closed without waiting for the worker."""
        if self.segments:
            self.segments[-1].last_round = self.round - 1
        if self.source is not None:
            source, self.source = self.source, None
            if park and not self.current.remote:  # it has not seen its last round's verdict
                self._parked[session_of(self.current)] = (source, len(self.context) - self._last_tokens)
                return
            _close(source, soon=park)

    def _close_parked(self) -> None:
        for source, _ in self._parked.values():
            _close(source)
        self._parked = {}

    def _note(self, setup: Setup, reason: str) -> None:
        switch = Switch(
            self.round,
            time.perf_counter() - self._started,
            time.time(),
            self.current.label if self.switches else "",
            setup.label,
            reason,
        )
        self.switches.append(switch)
        log.info("drafting: %s -> %s (%s)", switch.from_setup or "start", switch.to_setup, reason)


def _close(source: DraftSource, soon: bool = False) -> None:
    """End ``source``'s session; ``soon``: without waiting for its worker to end it (a move away from it,
    whose next round goes on meanwhile)."""
    try:
        if soon:
            close_soon(source)
        else:
            source.close()
    except SpecwireError as err:  # a worker gone at the end loses nothing already verified
        log.info("closing %s: %s", source.name, err)
