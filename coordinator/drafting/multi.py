"""Drafting with several workers at once: every round goes to each, and the first reply is used.

Each worker keeps its own session over the stream protocol and receives
every verdict, with the appended tokens spelled out (``Round.appended``), so
a worker whose drafts lost the race stays in sync with the accepted context.
The engine gets the drafts of whichever worker answers first, which is also
the hedge against a worker that stalls: the others carry on, and a worker
that fails is dropped for the rest of the generation.

Two modes, for pre-speculating workers:

* ``split``: the fan-out is split, so worker i drafts only the branches of
  rank i, i + n, ... (``PreSpeculation.shard``/``shards``); together they
  cover more verdicts, and the worker holding the right branch answers at once.
* ``race``: every worker drafts the same most likely branches; the fastest
  answer wins.

A worker still busy with an earlier round gets the next one as soon as it
is free; one that falls ``MAX_LAG`` rounds behind is dropped.

In fill mode (``coordinator.drafting.fill``) every worker answers at once
with what it has ready, so the first answer is not the best: every live
worker's answer is awaited (each costs only its link) and the one with the
most drafts ready is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from coordinator.drafting.base import Outcome
from coordinator.drafting.stream import StreamDraftSource
from coordinator.runtime import LoopPortal
from specwire.drafter import DraftBlock
from specwire.errors import InvalidArgumentError, RemoteWorkerError
from specwire.sampling import SamplingParams

MODES = ("split", "race")
DEFAULT_MODE = "race"  # measured ahead of split on the test bed; see the README
MAX_LAG = 2


class MultiWorkerDraftSource:
    """A draft source racing several workers' stream sessions (see the module docstring)."""

    def __init__(
        self, portal: LoopPortal, sources: Sequence[StreamDraftSource], mode: str, fill: bool = False
    ) -> None:
        if mode not in MODES:
            raise InvalidArgumentError(f"multi-worker mode {mode!r} is not one of {', '.join(MODES)}")
        if len(sources) < 2:
            raise InvalidArgumentError("multi-worker drafting needs at least two workers")
        self.portal = portal
        self.sources = list(sources)
        self.mode = mode
        self.fill = fill
        self.name = f"multi-{mode}:" + "+".join(s.worker for s in sources)
        self.live: list[StreamDraftSource] = []
        self.winners: list[str] = []
        self.dropped: list[tuple[str, str]] = []
        self._round = 0  # rounds asked for since the session opened (each worker's seq for them)
        self._filled: tuple[int, list[int]] = (0, [])  # the latest round pushed, and its drafts
        self._pending: dict[int, list[asyncio.Task[DraftBlock]]] = {}
        self._last: list[int] = []

    # The engine's interface; called on the compute thread.

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        """Open a session on every worker."""
        self.portal.call(self._start, list(prompt), params, k)

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Send the verdict to every worker; return the first drafts to arrive."""
        return self.portal.call(self._propose, k, outcome)

    def push_filled(self, tokens: Sequence[int]) -> None:
        """Fill mode with push: send every worker that answered this round with other drafts the ones
        used; a worker that answers later gets them once it has (``_after``)."""
        if self.sources and self.sources[0].pushes:
            self.portal.call(self._push_filled, list(tokens))

    def close(self) -> None:
        """Let every worker finish its last round, then end every session."""
        self.portal.call(self._close)

    def abort(self) -> None:
        """Drop every session at once, without waiting on workers that may not answer."""
        self.portal.call(self._abort)

    # The event-loop side.

    async def _start(self, prompt: list[int], params: SamplingParams, k: int) -> None:
        self.live, self.winners, self.dropped, self._pending, self._last = [], [], [], {}, []
        self._round, self._filled = 0, (0, [])
        errors = []
        for source in self.sources:
            try:
                await source.open_session(prompt, params, k)
            except RemoteWorkerError as err:
                errors.append(err)
                self.dropped.append((source.worker, str(err)))
                continue
            self.live.append(source)
            self._pending[id(source)] = []
        if not self.live:
            raise errors[0]

    async def _propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        appended = None if outcome is None else outcome.tokens(self._last)
        self._round += outcome is not None
        racing: dict[asyncio.Task[DraftBlock], StreamDraftSource] = {}
        for source in list(self.live):
            tasks = self._pending[id(source)]
            failed = next(
                (t.exception() for t in tasks if t.done() and not t.cancelled() and t.exception()), None
            )
            if failed is not None:  # a round this worker lost the race on has failed since: it is gone
                await self._drop(source, str(failed))
                continue
            queue = [t for t in tasks if not t.done()]
            if len(queue) >= MAX_LAG:
                await self._drop(source, f"fell {len(queue)} rounds behind")
                continue
            previous = queue[-1] if queue else None
            task = asyncio.ensure_future(self._after(previous, source, k, outcome, appended))
            task.add_done_callback(_retrieved)  # a loser's failure is recorded above, never left unread
            self._pending[id(source)] = [*queue, task]
            racing[task] = source
        first_error: BaseException | None = None
        best: tuple[DraftBlock, StreamDraftSource] | None = None
        while racing:
            done, _ = await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                source = racing.pop(task)
                error = task.exception()
                if error is None:
                    block = task.result()
                    if best is None or len(block.tokens) > len(best[0].tokens):
                        best = block, source
                    continue
                first_error = first_error or error
                await self._drop(source, str(error))
            if best is not None and (not self.fill or not racing or len(best[0].tokens) >= k):
                block, source = best
                self.winners.append(source.worker)
                self._last = block.tokens
                return block
        if isinstance(first_error, RemoteWorkerError):
            raise first_error
        raise RemoteWorkerError(f"every worker of {self.name} was lost: {first_error}", "UNAVAILABLE")

    async def _push_filled(self, tokens: list[int]) -> None:
        self._filled = (self._round, tokens)
        for source in list(self.live):
            try:
                await source.send_filled(tokens, self._round)
            except RemoteWorkerError as err:
                await self._drop(source, str(err))

    async def _after(
        self,
        previous: asyncio.Task[DraftBlock] | None,
        source: StreamDraftSource,
        k: int,
        outcome: Outcome | None,
        appended: list[int] | None,
    ) -> DraftBlock:
        if previous is not None:
            await asyncio.wait([previous])
        block = await source.exchange(k, outcome, appended)
        seq, tokens = self._filled
        if seq and seq == source.seq:  # answered after the round's drafts were pushed: its turn now
            await source.send_filled(tokens, seq)
        return block

    async def _drop(self, source: StreamDraftSource, reason: str) -> None:
        if source in self.live:
            self.live.remove(source)
            self.dropped.append((source.worker, reason))
            await source.cancel_session()

    async def _abort(self) -> None:
        for task in [t for tasks in self._pending.values() for t in tasks]:
            task.cancel()
        for source in self.sources:
            await source.cancel_session()
        self.live = []

    async def _close(self) -> None:
        pending = [t for tasks in self._pending.values() for t in tasks]
        if pending:
            await asyncio.wait(pending)
        for task in pending:
            if not task.cancelled():
                task.exception()  # retrieved: a dropped worker's error is already recorded
        for source in self.live:
            await source.close_session()


def _retrieved(task: asyncio.Task[DraftBlock]) -> None:
    """Mark a finished task's exception as read (the round's owner reads or records it)."""
    if not task.cancelled():
        task.exception()
