"""Remote drafting over the stream protocol: one message each way per round.

The engine runs on the coordinator's compute thread and calls this source
synchronously; each call crosses once to the event loop
(``runtime.LoopPortal``), where the gRPC stream lives. ``start`` sends Open
and returns at once, so the worker prefills and drafts round 0 while the target prefills.
Each ``propose`` sends one Round (the previous outcome and the next k) and
reads until the Drafts of that round arrive; replies are matched by seq, so
drafts that arrive early are simply kept.

Every exchange is recorded as a ``CallRecord`` (client send/receive times,
client encode/decode time, bytes each way, and the worker's own durations),
and the source counts its messages so they can be checked against the
worker's counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from coordinator.drafting.base import Outcome
from coordinator.runtime import LoopPortal
from coordinator.workers.connection import WorkerConnection
from coordinator.workers.stream_call import StreamCall
from specwire.drafting.drafter import DraftBlock
from specwire.drafting.sampling import SamplingParams
from specwire.drafting.token_tree import TokenTree
from specwire.emulation.pace import counted
from specwire.errors import InvalidArgumentError, RemoteWorkerError
from specwire.logits.processors import Processing
from specwire.v1 import draft_pb2 as pb
from specwire.wire.processing import processing_to_pb
from specwire.wire.protocol import (
    DRAFT_METHOD,
    PROTOCOL_VERSION,
    dists_from_pb,
    sampling_to_pb,
    timing_from_pb,
    tree_from_pb,
)
from specwire.wire.timing import CallRecord

log = logging.getLogger(__name__)

ROUND_TIMEOUT_S = 60.0
SPECULATION_NAMES = {
    pb.SPECULATION_HIT: "hit",
    pb.SPECULATION_PARTIAL: "partial",
    pb.SPECULATION_MISS: "miss",
}


class StreamDraftSource:
    """A draft source backed by a worker's DraftWorker.Draft stream."""

    def __init__(
        self,
        portal: LoopPortal,
        connection: WorkerConnection,
        fingerprint: str,
        round_timeout: float = ROUND_TIMEOUT_S,
        prespec: pb.PreSpeculation | None = None,
        tree_nodes: int = 0,
        cache_key: str = "",
    ) -> None:
        self.portal = portal
        self.cache_key = cache_key  # this coordinator's prompt-cache scope on the worker ("": none)
        self.tree_nodes = tree_nodes  # > 0: each Round asks for a tree of at most this many nodes
        self.connection = connection
        self.fingerprint = fingerprint
        self.round_timeout = round_timeout
        self.prespec = prespec
        self.name = f"stream+prespec:{connection.name}" if prespec else f"stream:{connection.name}"
        self.processing: Processing | None = None  # the next generation's penalties and grammar
        self._stream: StreamCall | None = None
        self._reset()

    def _reset(self) -> None:
        self.sent = 0
        self.sent_by_reply = 0  # messages sent when the latest Drafts came: the worker's count in it
        self.received = 0
        self.rounds_received = 0  # Drafts messages in hand, and the draft tokens they carried
        self.drafts_received = 0
        self.opened: pb.Opened | None = None
        self.worker_counters = pb.SessionCounters()
        self.pace_headroom: list[int] = []  # the worker's paced passes by headroom, over the session
        self._seq = 0
        self._open_k = 0
        self._tree_nodes = 0
        self._early: dict[int, tuple[pb.Drafts, int, int, int, int]] = {}
        self._verifying: asyncio.Future[tuple[int, int, int, int]] | None = None  # a Verifying being written
        self._opening: asyncio.Future[None] | None = None  # reading the Open's Drafts (``arrived``)
        self._open_record: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def worker(self) -> str:
        """The worker's Bonjour name."""
        return self.connection.name

    # The engine's interface; called on the compute thread.

    def use_processing(self, processing: Processing | None) -> None:
        """The next generation's penalties and grammar (before ``start``): the Open carries them, and the
        worker drafts under them."""
        self.processing = processing

    def start(self, prompt: Sequence[int], params: SamplingParams, k: int) -> None:
        """Open a session on the worker; it prefills and drafts k tokens right away."""
        self.portal.call(self.open_session, list(prompt), params, k)

    def propose(self, k: int, outcome: Outcome | None) -> DraftBlock:
        """Send the previous outcome and k, and return the worker's drafts."""
        requested = time.perf_counter_ns()
        appended = list(outcome.appended) if outcome is not None and outcome.appended else None
        block = self.portal.call(self.exchange, k, outcome, appended)
        record = block.calls[0]
        block.calls[0] = replace(record, requested_ns=requested, returned_ns=time.perf_counter_ns())
        return block

    def open_arrived(self) -> bool:
        """Whether the Open's drafts are in hand, so that the first ``propose`` will not wait: for a
        session opened ahead while the target decodes without it. Never waits; a worker lost on the way
        is ``RemoteWorkerError`` here or at that ``propose``."""
        return self.portal.call(self._open_arrived)

    async def _open_arrived(self) -> bool:
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._read_until(0, "waiting for the Open's drafts"))
        if self._opening.done():
            self._opening.result()  # its error, if the worker is gone
            return True
        return False

    def verifying(
        self, reply_nodes: int, tokens: Sequence[int] = (), parents: Sequence[int] = (), after_ns: int = 0
    ) -> None:
        """Tell the worker what the target now verifies of the latest reply (its first ``reply_nodes``
        nodes, then ``tokens`` drafted here, each after ``parents[i]``), ``after_ns`` after the reply came.
        Returns at once: the verification starts without waiting for the loop, and the next round's
        exchange collects the write (and its error, if the worker is gone) before sending."""
        self.portal.submit(self.send_verifying, reply_nodes, list(tokens), list(parents), after_ns)

    async def send_verifying(
        self, reply_nodes: int, tokens: list[int], parents: list[int], after_ns: int
    ) -> None:
        msg = pb.Verifying(
            seq=self._seq, reply_nodes=reply_nodes, tokens=tokens, parents=parents, started_after_ns=after_ns
        )
        self._verifying = asyncio.ensure_future(
            self._send(pb.DraftRequest(verifying=msg), f"Verifying of round {self._seq}")
        )

    async def _sent_verifying(self) -> None:
        """Wait for the latest Verifying's write, raising its error."""
        pending, self._verifying = self._verifying, None
        if pending is not None:
            await pending

    @property
    def seq(self) -> int:
        """The latest round asked for (0: the Open's)."""
        return self._seq

    def close(self) -> None:
        """End the session; the worker frees its KV cache."""
        if self._stream is not None:
            self.portal.call(self.close_session)

    def close_soon(self) -> None:
        """End the session without waiting for the worker to end it: a move away from this session goes on
        meanwhile (a paced worker mid-pass took up to 16 ms to end it on the paper's test bed, a round's
        wait at every move). Its counters are those of its last reply, which the close does not change."""
        if self._stream is not None:
            self.portal.submit(self._close_quietly)

    async def _close_quietly(self) -> None:
        try:
            await self.close_session()
        except Exception as err:  # nobody waits for this close: a failure is logged, not raised
            log.info("closing %s: %s", self.name, err)

    def abort(self) -> None:
        """Drop the session at once, without waiting for a worker that may not answer."""
        if self._stream is not None:
            self.portal.call(self.cancel_session)

    # The event-loop side; a source that drives several workers calls these directly.

    async def cancel_session(self) -> None:
        """Drop the session at once (event loop)."""
        for pending in (self._verifying, self._opening):
            if pending is not None:
                pending.cancel()
        self._verifying = self._opening = None
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()

    async def open_session(self, prompt: list[int], params: SamplingParams, k: int) -> None:
        self._reset()
        self._open_k = k
        self._tree_nodes = self.tree_nodes  # trees are verified by the target's draws at any temperature
        self._stream = StreamCall(self.connection, DRAFT_METHOD, self.round_timeout)
        prespec = self.prespec
        if prespec is not None and prespec.tree and not params.greedy and not self.tree_nodes:
            # a chain of the tree's first choices is greedy: at T > 0 only its trees are asked for
            prespec = pb.PreSpeculation()
            prespec.CopyFrom(self.prespec)
            prespec.tree = False  # a sampled session fills as plain fill mode does
        request = pb.DraftRequest(
            open=pb.Open(
                protocol_version=PROTOCOL_VERSION,
                prompt_tokens=prompt,
                sampling=sampling_to_pb(params),
                k=k,
                vocab_fingerprint=self.fingerprint,
                prespec=prespec,
                cache_key=self.cache_key,
                processing=processing_to_pb(self.processing),
            )
        )
        self._open_record = await self._send(request, "opening a session")

    async def exchange(
        self, k: int, outcome: Outcome | None, appended: list[int] | None = None
    ) -> DraftBlock:
        entered = time.perf_counter_ns()
        if outcome is None:
            if k > self._open_k:
                raise InvalidArgumentError(
                    f"first round asks for {k} drafts; the session opened with {self._open_k}"
                )
            seq, sent = 0, self._open_record
            if self._opening is not None:  # being read ahead (``arrived``): one reader at a time
                await self._opening
        else:
            await self._sent_verifying()  # the stream takes one write at a time, in order
            self._seq += 1
            seq = self._seq
            round_msg = pb.Round(
                seq=seq,
                accepted=outcome.accepted,
                token=outcome.token,
                k=k,
                appended=appended or [],
                tree_nodes=self._tree_nodes,
                catch_up=outcome.catch_up,
            )
            sent = await self._send(pb.DraftRequest(round=round_msg), f"round {seq}")
        drafts, raw_len, deserialize_ns, read_at, received_at = await self._receive_drafts(seq)
        send_ns, serialize_ns, bytes_sent, written_at = sent
        record = CallRecord(
            kind="open" if seq == 0 else "round",
            send_ns=send_ns,
            receive_ns=received_at,
            serialize_ns=serialize_ns,
            deserialize_ns=deserialize_ns,
            bytes_sent=bytes_sent,
            bytes_received=raw_len,
            server=timing_from_pb(drafts.timing),
            entered_ns=entered if seq else 0,
            written_ns=written_at,
            read_ns=read_at,
        )
        dists = dists_from_pb(drafts)
        tree = self._tree_of(
            drafts, k
        )  # a tree keeps all its nodes (k bounds its depth); a chain its first k
        return DraftBlock(
            tokens=list(drafts.tokens) if tree is not None else list(drafts.tokens)[:k],
            dists=dists[:k] if dists is not None else None,
            forward_passes=0 if tree is not None else len(drafts.tokens),
            compute_ns=drafts.timing.compute_ns,
            calls=[record],
            speculation=SPECULATION_NAMES.get(drafts.speculation.outcome, ""),
            saved_ns=drafts.speculation.saved_ns,
            tree=tree,
            tree_probs=list(drafts.node_probs),
        )

    def _tree_of(self, drafts: pb.Drafts, k: int) -> TokenTree | None:
        """The tree a reply carries (None: a chain), or ``RemoteWorkerError`` for one not asked for."""
        try:
            tree = tree_from_pb(drafts)
            if tree is not None:
                if not self._tree_nodes:
                    raise InvalidArgumentError("a tree of drafts where a chain was asked for")
                tree.check(self.connection.hello.model.vocab_size, self._tree_nodes, k)
        except InvalidArgumentError as err:
            raise RemoteWorkerError(f"worker {self.connection.name} sent a malformed tree: {err}") from err
        return tree

    async def _send(self, request: pb.DraftRequest, action: str) -> tuple[int, int, int, int]:
        """Encode and write one message; returns (send time, encode ns, bytes, when gRPC took it)."""
        assert self._stream is not None
        t0 = time.perf_counter_ns()
        data = request.SerializeToString()
        t1 = time.perf_counter_ns()
        written_at = await self._stream.write(data, action)
        self.sent += 1
        return t1, t1 - t0, len(data), written_at

    async def _receive_drafts(self, seq: int) -> tuple[pb.Drafts, int, int, int, int]:
        """The Drafts of round ``seq``, read until in hand (earlier arrivals are kept)."""
        await self._read_until(seq, f"waiting for round {seq}")
        return self._early.pop(seq)

    async def _read_until(self, seq: int, action: str) -> None:
        """Read until the Drafts of round ``seq`` are in hand."""
        while seq not in self._early:
            reply, raw_len, deserialize_ns, read_at, received_at = await self._read(action)
            kind = reply.WhichOneof("kind")
            if kind == "opened":
                self.opened = reply.opened
            elif kind == "drafts":
                self._early[reply.drafts.seq] = (reply.drafts, raw_len, deserialize_ns, read_at, received_at)
                self.worker_counters = reply.drafts.counters
                self.sent_by_reply = self.sent  # a Verifying goes only after the Drafts it names
                self.pace_headroom = counted(self.pace_headroom, reply.drafts.counters.pace_buckets)
                self.rounds_received += 1
                self.drafts_received += len(reply.drafts.tokens)
            else:
                raise RemoteWorkerError(f"worker {self.connection.name} sent an empty reply", "INTERNAL")

    async def _read(self, action: str) -> tuple[pb.DraftReply, int, int, int, int]:
        assert self._stream is not None
        parsed = await self._stream.read_message(pb.DraftReply, action)
        self.received += 1
        return parsed

    async def close_session(self) -> None:
        opening, self._opening = self._opening, None
        if opening is not None and not opening.done():  # closed while the Open's drafts were read ahead
            # Cancelling a read cancels its gRPC call (grpc.aio), so the stream is dropped, not
            # half-closed; the worker frees the session when it sees the cancel.
            opening.cancel()
            await asyncio.wait([opening])
            await self.cancel_session()
            return
        with contextlib.suppress(RemoteWorkerError):  # a worker gone since is found by the close
            await self._sent_verifying()
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()
