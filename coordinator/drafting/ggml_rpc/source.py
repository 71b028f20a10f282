"""The per-op baseline as a draft source: the shared drafter driving a model walked on the worker."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.drafting.base import Outcome
from coordinator.drafting.ggml_rpc.client import CALL_TIMEOUT_S, TensorClient
from coordinator.drafting.ggml_rpc.graph import ForwardGraph, Walk
from coordinator.drafting.ggml_rpc.model import GRANULARITIES, RemoteDraftModel
from coordinator.runtime import LoopPortal
from coordinator.workers.connection import WorkerConnection
from specwire.drafting.drafter import DraftBlock, Drafter
from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError


class PerOpDraftSource:
    """Drafts by sending the draft model's operations to a worker, GGML_RPC style."""

    def __init__(
        self,
        portal: LoopPortal,
        connection: WorkerConnection,
        fingerprint: str,
        granularity: str,
        call_timeout: float = CALL_TIMEOUT_S,
    ) -> None:
        if granularity not in GRANULARITIES:
            raise InvalidArgumentError(
                f"granularity {granularity!r}: expected one of {', '.join(GRANULARITIES)}"
            )
        self.portal = portal
        self.connection = connection
        self.fingerprint = fingerprint
        self.granularity = granularity
        self.call_timeout = call_timeout
        self.name = f"ggml-rpc/{granularity}:{connection.name}"
        self.client: TensorClient | None = None
        self.prefill_calls = 0
        self._drafter: Drafter | None = None

    @property
    def worker(self) -> str:
        """The worker's Bonjour name."""
        return self.connection.name

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        """Open a tensor session and prefill the prompt through it."""
        if not params.greedy and self.granularity == "round":
            raise InvalidArgumentError(
                "granularity round chains greedy drafts on the worker (a tensor executor cannot sample); "
                "use T = 0 or a finer granularity"
            )
        client = TensorClient(self.connection, self.fingerprint, self.call_timeout)
        opened = self.portal.call(client.open)
        self.client = client
        graph = ForwardGraph(Walk.of(opened))
        self._drafter = Drafter(RemoteDraftModel(self.portal, client, graph, self.granularity), params)
        self._drafter.start(prompt)
        self.prefill_calls = client.calls

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Apply the last outcome (a KV_TRIM if drafts were rejected), then draft k tokens."""
        if self._drafter is None or self.client is None:
            raise InvalidArgumentError("propose() before start()")
        first = len(self.client.records)
        if outcome is not None:
            self._drafter.apply(outcome.accepted, outcome.token)
        block = self._drafter.draft(k)
        block.calls = self.client.records[first:]
        return block

    def close(self) -> None:
        """End the tensor session."""
        if self.client is not None:
            self.portal.call(self.client.close)
        self._drafter = None

    def abort(self) -> None:
        """Drop the tensor session at once, without waiting for a worker that may not answer."""
        if self.client is not None:
            self.portal.call(self.client.abort)
        self._drafter = None
