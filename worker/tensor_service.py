"""The per-op baseline, worker side: ``TensorWorker.Execute``, a GGML_RPC-style tensor executor.

One Execute stream is one session (hosted by ``worker.hosting``, like the
stream protocol's sessions, so both backends share admission, shutdown and
error handling). The first message opens the session and gets the module
handle table and the session's handle tag; every later message is a Graph of
operations, executed where the worker computes and answered by one GraphResult
carrying the requested tensors, the worker's durations and the session's
counters.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from specwire.emulation.pace import Pacer
from specwire.errors import (
    InvalidArgumentError,
    UnsupportedModelError,
)
from specwire.models import LoadedModel
from specwire.models.op_counts import block_kinds, ops_per_pass
from specwire.process.compute import ComputeThread
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import TENSOR_SERVICE_NAME
from worker.checks import check_peer
from worker.hosting import SessionHost, StreamLoop, encode_timed, server_timing
from worker.tensor_modules import ModuleTable
from worker.tensor_session import TensorSession


def walkable(model: LoadedModel) -> tuple[ModuleTable | None, str]:
    """The model's module table, or None and why the per-op executor cannot walk it."""
    try:
        block_kinds(model.args)
        return ModuleTable.of(model.model), ""
    except UnsupportedModelError as err:
        return None, str(err)


class TensorService:
    """Serves the tensor executor for one model to many concurrent sessions."""

    def __init__(
        self, model: LoadedModel, host: SessionHost, compute: ComputeThread, pacer: Pacer | None = None
    ) -> None:
        self.model = model  # unpaced: the executor holds each call itself, for its share of a pass
        self.host = host
        self.compute = compute
        self.pacer = pacer
        self.table, self.refusal = walkable(model)

    def handler(self) -> grpc.GenericRpcHandler:
        """The gRPC handler of the TensorWorker service."""
        return grpc.method_handlers_generic_handler(
            TENSOR_SERVICE_NAME, {"Execute": grpc.stream_stream_rpc_method_handler(self.execute)}
        )

    async def execute(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        """One session: open, then graphs, until the stream ends."""
        await self.host.serve(requests, _TensorLoop(self, context))


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
        model, table = self.service.model, self.service.table
        check_peer(model, msg.protocol_version, msg.vocab_fingerprint)
        if table is None:
            raise UnsupportedModelError(self.service.refusal)
        tag = secrets.randbits(31) + 1
        self.session = TensorSession(
            model, table, tag, pacer=self.service.pacer, ops_per_pass=ops_per_pass(model.args)
        )
        self.service.host.totals.sessions_opened += 1
        opened = pb.TensorOpened(
            identity=self.service.host.info.identity(),
            session_tag=tag,
            modules=[pb.ModuleHandle(name=n, handle=h) for n, h in table.names.items()],
        )
        await self.send(pb.TensorReply(opened=opened).SerializeToString())


def _parse(raw: bytes) -> pb.TensorRequest:
    try:
        return pb.TensorRequest.FromString(raw)
    except DecodeError as err:
        raise InvalidArgumentError(f"malformed TensorRequest ({len(raw)} bytes): {err}") from err
