"""The per-op baseline, worker side: ``TensorWorker.Execute``, a GGML_RPC-style tensor executor.

One Execute stream is one session (hosted by ``worker.server.hosting``, like the
stream protocol's sessions, so both backends share admission, shutdown and
error handling). The first message opens the session and gets the model's
walk (``worker.per_op.op_walk``: its operations' names and handles, in pass order);
every later message is a Graph of operations, executed where the worker
computes and answered by one GraphResult carrying the requested tensors, the
worker's durations and the session's counters.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import grpc
from google.protobuf.message import DecodeError

from specwire.emulation.pace import Pacer
from specwire.errors import (
    InvalidArgumentError,
    UnsupportedModelError,
)
from specwire.models.loading import LoadedModel
from specwire.process.compute import ComputeThread
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import TENSOR_SERVICE_NAME
from worker.per_op.op_walk import Walk, trace
from worker.per_op.tensor_session import TensorSession
from worker.server.hosting import SessionHost, StreamLoop, encode_timed, server_timing
from worker.server.peer import check_peer


def walk_of(model: LoadedModel) -> tuple[Walk | None, str]:
    """The model's walk, or None and why the per-op executor cannot split its pass. Compute thread."""
    try:
        return trace(model.model), ""
    except UnsupportedModelError as err:
        return None, str(err)


class TensorService:
    """Serves the tensor executor for one model to many concurrent sessions."""

    def __init__(
        self,
        model: LoadedModel,
        walk: Walk | None,
        host: SessionHost,
        compute: ComputeThread,
        pacer: Pacer | None = None,
        refusal: str = "",
    ) -> None:
        self.model = model  # unpaced: the executor holds each call itself, for its share of a pass
        self.walk = walk  # None: the model's pass cannot be split (``refusal`` says why)
        self.host = host
        self.compute = compute
        self.pacer = pacer
        self.refusal = refusal

    def handler(self) -> grpc.GenericRpcHandler:
        """The gRPC handler of the TensorWorker service."""
        return grpc.method_handlers_generic_handler(
            TENSOR_SERVICE_NAME, {"Execute": grpc.stream_stream_rpc_method_handler(self.execute)}
        )

    async def execute(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        """One session: open, then graphs, until the stream ends."""
        loop = _TensorLoop(self, context)
        try:
            await self.host.serve(requests, loop)
        finally:
            if loop.session is not None:  # a pass left half walked unwinds on the compute thread
                with anyio.CancelScope(shield=True):
                    await self.compute.run(loop.session.close)


class _TensorLoop(StreamLoop):
    """Parses, executes and replies for one Execute stream."""

    def __init__(self, service: TensorService, context: grpc.aio.ServicerContext) -> None:
        super().__init__(context)
        self.service = service
        self.session: TensorSession | None = None
        self.next_seq = 1

    async def handle(self, arrived_ns: int, raw: bytes) -> None:
        t0 = time.perf_counter_ns()
        request = _parse(raw)
        deserialize_ns = time.perf_counter_ns() - t0
        kind = request.WhichOneof("kind")
        if self.session is None:
            if kind != "open":
                raise InvalidArgumentError("the first message of a tensor session must be TensorOpen")
            await self._open(request.open)
            return
        if kind != "graph":
            raise InvalidArgumentError("after TensorOpen, every message must be a Graph")
        graph = request.graph
        if graph.seq != self.next_seq:
            raise InvalidArgumentError(f"graph seq {graph.seq} out of order; expected {self.next_seq}")
        self.next_seq += 1
        session = self.session
        before = session.forward_passes
        executed = await self.service.compute.run(session.execute, graph.ops)
        self.service.host.totals.forward_passes += session.forward_passes - before
        t1 = time.perf_counter_ns()
        result = pb.GraphResult(
            seq=graph.seq,
            tensors=executed.tensors,
            timing=server_timing(
                deserialize_ns, arrived_ns, executed.started_ns, executed.finished_ns, t1, self.last_send_ns
            ),
            counters=pb.TensorCounters(
                messages_received=self.received,
                messages_sent=self.sent,
                graphs=session.graphs,
                ops=session.ops,
                tensor_bytes=session.tensor_bytes,
                paced_passes=session.paced_passes,
                pace_overruns=session.pace_overruns,
                pace_buckets=session.take_pace_buckets(),
            ),
        )
        data = encode_timed(
            pb.TensorReply(result=result),
            lambda timing: pb.TensorReply(result=pb.GraphResult(timing=timing)),
            t1,
        )
        await self.send(data)

    async def _open(self, msg: pb.TensorOpen) -> None:
        model, walk = self.service.model, self.service.walk
        check_peer(model, msg.protocol_version, msg.vocab_fingerprint)
        if walk is None:
            raise UnsupportedModelError(self.service.refusal)
        self.session = await self.service.compute.run(
            lambda: TensorSession(model, walk, pacer=self.service.pacer)
        )
        self.service.host.totals.sessions_opened += 1
        opened = walk.announce()
        opened.identity.CopyFrom(self.service.host.info.identity())
        await self.send(pb.TensorReply(opened=opened).SerializeToString())


def _parse(raw: bytes) -> pb.TensorRequest:
    try:
        return pb.TensorRequest.FromString(raw)
    except DecodeError as err:
        raise InvalidArgumentError(f"malformed TensorRequest ({len(raw)} bytes): {err}") from err
