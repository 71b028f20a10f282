"""Going on when a worker dies, stalls or restarts in the middle of a generation.

``FailoverDraftSource`` wraps a remote draft source. It keeps the full
accepted context (prompt, then every accepted draft and target token), so
when the worker fails (a ``RemoteWorkerError``: the stream broke, a deadline
passed, the worker restarted) it can carry on under ``--on-worker-loss``:

* ``failover`` (the default): open a session on the next compatible worker
  with the whole accepted context and draft from there; with none left,
  go on autoregressively;
* ``local``: draft with a local draft model from the accepted context;
* ``ar``: stop drafting; the target goes on alone;
* ``fail``: stop with the error.

The target's state is never touched, so nothing accepted is lost or
repeated, and at T = 0 the output is exactly the uninterrupted one. Every
loss is logged and recorded (when, which worker, why, what happened next).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coordinator.drafting.base import DraftSource, Outcome, close_soon, offer_processing
from specwire.drafting.drafter import DraftBlock
from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError, RemoteWorkerError, SpecwireError
from specwire.logits.processors import Processing

log = logging.getLogger(__name__)
POLICIES = ("failover", "local", "ar", "fail")


@dataclass(frozen=True)
class WorkerLoss:
    """One lost worker: when (perf_counter_ns and wall clock), which, why, and what came next."""

    at_ns: int
    wall_time: float
    worker: str
    error: str
    code: str
    action: str


class FailoverDraftSource:
    """A draft source that survives the loss of its worker."""

    def __init__(
        self,
        first: DraftSource,
        policy: str,
        next_source: Callable[[set[str]], DraftSource | None] | None = None,
        local_source: Callable[[], DraftSource] | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise InvalidArgumentError(f"--on-worker-loss {policy!r}: expected one of {', '.join(POLICIES)}")
        self.current: DraftSource | None = first
        self.policy = policy
        self.next_source = next_source
        self.local_source = local_source
        self.name = first.name
        self.losses: list[WorkerLoss] = []
        self.retired: list[DraftSource] = []
        self._context: list[int] = []
        self._last: list[int] = []
        self._params = SamplingParams()
        self._failed: set[str] = set()
        self._processing: Processing | None = None  # the generation's, offered to each source it opens

    def use_processing(self, processing: Processing | None) -> None:
        """The next generation's penalties and grammar (before ``start``)."""
        self._processing = processing

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        """Begin on the first worker; if it fails right away, recover like any other loss."""
        self._context, self._last, self._params = list(prompt), [], params
        self._start_current(k)

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Draft on the current source; on a loss, recover and draft from the accepted context."""
        if outcome is not None:
            self._context += outcome.tokens(self._last)
        while self.current is not None:
            try:
                block = self.current.propose(k, outcome)
                self._last = block.tokens
                return block
            except RemoteWorkerError as err:
                self._lost(err)
                outcome = None  # the new session starts from the whole accepted context
                self._start_current(k)
        self._last = []
        return DraftBlock([], None, 0, 0)

    def verifying(
        self, reply_nodes: int, tokens: Sequence[int] = (), parents: Sequence[int] = (), after_ns: int = 0
    ) -> None:
        """Tell the current worker what the target verifies (``StreamDraftSource.verifying``); a worker
        lost meanwhile is found, and recovered from, at the next round."""
        tell = getattr(self.current, "verifying", None)
        if tell is not None:
            tell(reply_nodes, tokens, parents, after_ns)

    def _start_current(self, k: int) -> None:
        """Open a session on the current source with the accepted context, recovering from losses."""
        while self.current is not None:
            try:
                offer_processing(self.current, self._processing)
                self.current.start(self._context, self._params, k)
                return
            except RemoteWorkerError as err:
                self._lost(err)

    def close(self) -> None:
        """End the current session."""
        if self.current is not None:
            self.current.close()

    def close_soon(self) -> None:
        """End the current session without waiting for its worker (``base.close_soon``)."""
        if self.current is not None:
            close_soon(self.current)

    def _lost(self, err: RemoteWorkerError) -> None:
        """Record the loss and pick what drafts next (None: autoregressive)."""
        assert self.current is not None
        lost = self.current
        worker = getattr(lost, "worker", lost.name)
        self._failed.add(worker)
        abandon(lost)
        self.retired.append(lost)
        if self.policy == "fail":
            raise err
        self.current = self._replacement()
        action = (
            f"drafting continues on {self.current.name}" if self.current else "continuing autoregressively"
        )
        loss = WorkerLoss(time.perf_counter_ns(), time.time(), worker, str(err), err.code, action)
        self.losses.append(loss)
        log.warning("lost %s (%s): %s; %s", lost.name, err.code, err, action)

    def _replacement(self) -> DraftSource | None:
        if self.policy == "local" and self.local_source is not None:
            return self.local_source()
        if self.policy == "failover" and self.next_source is not None:
            try:
                return self.next_source(self._failed)
            except SpecwireError as err:
                log.warning("no worker to fail over to: %s", err)
        return None


def abandon(source: DraftSource | None) -> None:
    """Drop a failed session without waiting on a worker that may not answer."""
    if source is None:
        return
    abort = getattr(source, "abort", None)
    with contextlib.suppress(SpecwireError):
        abort() if abort is not None else source.close()
