"""A worker's DraftSession driven in-process, as a draft source, for statistical tests.

The real session code (pre-speculation included) runs without gRPC, so a test
can generate thousands of times on tiny models. Speculation is planned right
after each round's drafts, as on a worker, and runs to its full budget when
the next round is asked for (on a worker it runs while the target verifies;
the branches are the same, since every block draws from its own random
stream). After the last round of a generation it is never run. In fill mode
(``PreSpeculation.fill``) each round is answered with what is ready, as a
worker answers, and the rest of the block is drafted by the next speculation.
"""

from __future__ import annotations

from collections.abc import Sequence

from specwire.drafting.drafter import DraftBlock
from specwire.drafting.sampling import SamplingParams
from specwire.logits.processors import Processing
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.processing import processing_to_pb
from specwire.wire.protocol import PROTOCOL_VERSION, sampling_to_pb
from worker.server.hosting import WorkerCounters
from worker.stream.session import DraftSession


class SessionSource:
    """Drafts through ``worker.stream.session.DraftSession`` with pre-speculation as given."""

    name = "session"

    def __init__(self, model: LoadedModel, prespec: pb.PreSpeculation, tree_nodes: int = 0) -> None:
        self.model = model
        self.prespec = prespec
        self.tree_nodes = tree_nodes  # > 0: each Round asks for a tree (a tree session's reply)
        self.totals = WorkerCounters()
        self.outcomes: list[int] = []
        self.verified: list[pb.Verifying] = []  # every Verifying the coordinator sent
        self._session: DraftSession | None = None
        self._first: DraftBlock | None = None
        self._seq = 0
        self._planned = False
        self.processing: Processing | None = None

    def use_processing(self, processing: Processing | None) -> None:
        """The next generation's penalties and grammar: the Open carries them, as a stream source's."""
        self.processing = processing

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        msg = pb.Open(
            protocol_version=PROTOCOL_VERSION,
            prompt_tokens=list(prompt),
            sampling=sampling_to_pb(params),
            k=k,
            vocab_fingerprint=self.model.fingerprint,
            prespec=self.prespec,
            processing=processing_to_pb(self.processing),
        )
        self._session = DraftSession(self.model, msg, self.totals)
        self._session.prefill()
        self._first = self._session.first_drafts().block
        self._seq = 0
        self._plan()

    def propose(self, k: int, outcome: object) -> DraftBlock:
        assert self._session is not None and self._first is not None
        if outcome is None:
            block = self._first
            return DraftBlock(block.tokens[:k], block.dists[:k] if block.dists else None, 0, 0)
        self._seq += 1
        appended = list(getattr(outcome, "appended", ()))
        msg = pb.Round(
            seq=self._seq,
            accepted=outcome.accepted,  # type: ignore[attr-defined]
            token=outcome.token,  # type: ignore[attr-defined]
            k=k,
            appended=appended,
            tree_nodes=self.tree_nodes,
        )
        self._speculate()
        if self._session.fill:  # answered with what is ready; the rest is drafted next, as on a worker
            answer = self._session.answer_ready(msg)
            self._session.settle_ready(answer)
            computed = answer.computed
        else:
            computed = self._session.serve_hit(msg) or self._session.round(msg)
        self.outcomes.append(computed.outcome)
        self._plan()
        return computed.block

    def verifying(
        self, reply_nodes: int, tokens: Sequence[int] = (), parents: Sequence[int] = (), after_ns: int = 0
    ) -> None:
        """What the target verifies, as a worker's stream service takes it (the session checks it)."""
        assert self._session is not None
        msg = pb.Verifying(
            seq=self._seq,
            reply_nodes=reply_nodes,
            tokens=list(tokens),
            parents=list(parents),
            started_after_ns=after_ns,
        )
        self._session.verifying(msg)
        self.verified.append(msg)

    def _plan(self) -> None:
        assert self._session is not None
        self._session.plan_speculation()
        self._planned = True

    def _speculate(self) -> None:
        assert self._session is not None
        if self._planned:
            while self._session.speculate():
                pass
            self._planned = False

    def close(self) -> None:
        self._session = None
