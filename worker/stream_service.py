"""The stream protocol, worker side: ``DraftWorker.Hello`` and ``DraftWorker.Draft``.

One Draft stream is one session. Its handler runs two tasks: a reader that
takes raw messages off the stream as they arrive (stamping their arrival
time), and the session loop that parses each one, runs the drafter on the
compute thread, and writes the reply. The reader never waits for the loop,
so the flow is not lock-step by construction: the loop is free to draft
ahead while no message is waiting.

The Draft method is registered without serializers: this module parses
requests and encodes replies itself and reports those durations, with the
compute time, in every reply's ServerTiming. Errors end the stream with the
status ``worker.status`` assigns; the worker and its other sessions go on.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import grpc
import msgpack
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from google.protobuf.message import DecodeError

from specwire.compute import ComputeThread
from specwire.errors import CapacityError, InvalidArgumentError, SpecwireError
from specwire.models import LoadedModel
from specwire.protocol import PROTOCOL_VERSION, SERVICE_NAME, drafts_to_pb
from specwire.v1 import draft_pb2 as pb
from worker.session import Computed, DraftSession, WorkerCounters
from worker.status import status_for

log = logging.getLogger(__name__)

INBOX_SIZE = 16


@dataclass(frozen=True)
class WorkerInfo:
    """Who this worker is; fixed at start."""

    name: str
    label: str
    backends: tuple[str, ...]
    draft_tps: float
    max_sessions: int
    host: str = socket.gethostname()
    pid: int = os.getpid()
    boot_id: str = uuid.uuid4().hex[:12]

    def identity(self) -> pb.WorkerIdentity:
        """This worker as a protocol message."""
        return pb.WorkerIdentity(
            name=self.name, label=self.label, host=self.host, pid=self.pid, boot_id=self.boot_id
        )


class DraftService:
    """Serves one draft model to many concurrent sessions."""

    def __init__(self, model: LoadedModel, info: WorkerInfo, compute: ComputeThread) -> None:
        self.model = model
        self.info = info
        self.compute = compute
        self.totals = WorkerCounters()
        self.shutting_down = anyio.Event()
        self._sessions: set[anyio.CancelScope] = set()

    def handler(self) -> grpc.GenericRpcHandler:
        """The gRPC handler of the DraftWorker service."""
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Hello": grpc.unary_unary_rpc_method_handler(
                    self.hello,
                    request_deserializer=pb.HelloRequest.FromString,
                    response_serializer=pb.HelloReply.SerializeToString,
                ),
                "Draft": grpc.stream_stream_rpc_method_handler(self.draft),
            },
        )

    async def hello(self, request: pb.HelloRequest, context: grpc.aio.ServicerContext) -> pb.HelloReply:
        """Describe this worker and its model."""
        config = msgpack.packb({k: v for k, v in self.model.args.items() if _plain(v)})
        t = self.totals
        return pb.HelloReply(
            protocol_version=PROTOCOL_VERSION,
            identity=self.info.identity(),
            model=pb.ModelInfo(
                spec=self.model.spec,
                fingerprint=self.model.fingerprint,
                precision=self.model.precision,
                vocab_size=self.model.vocab_size,
                context_length=self.model.context_length,
                config_msgpack=config,
            ),
            backends=list(self.info.backends),
            draft_tokens_per_second=self.info.draft_tps,
            max_sessions=self.info.max_sessions,
            counters=pb.WorkerCounters(
                sessions_opened=t.sessions_opened,
                sessions_active=t.sessions_active,
                forward_passes=t.forward_passes,
                draft_tokens=t.draft_tokens,
            ),
        )

    async def shutdown(self) -> None:
        """End every open session with UNAVAILABLE; new sessions are refused."""
        self.shutting_down.set()
        for scope in list(self._sessions):
            scope.cancel()

    async def draft(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        """One session: read messages, draft, reply, until the stream ends."""
        try:
            if self.shutting_down.is_set():
                raise _Unavailable(f"worker {self.info.name} is shutting down")
            if self.totals.sessions_active >= self.info.max_sessions:
                raise CapacityError(
                    f"worker {self.info.name} is serving its maximum of {self.info.max_sessions} sessions"
                )
            self.totals.sessions_active += 1
            try:
                await self._run_session(requests, context)
            finally:
                self.totals.sessions_active -= 1
        except SpecwireError as err:
            log.info("session refused or ended: %s", err)
            context.set_code(status_for(err))
            context.set_details(str(err))
        except _Unavailable as err:
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details(str(err))

    async def _run_session(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        send, receive = anyio.create_memory_object_stream[tuple[int, bytes]](INBOX_SIZE)
        error: BaseException | None = None
        with receive:
            async with anyio.create_task_group() as tg:
                self._sessions.add(tg.cancel_scope)
                tg.start_soon(_read_requests, requests, send)
                try:
                    await _SessionLoop(self, context).run(receive)
                except (SpecwireError, _Unavailable) as err:
                    error = err  # re-raised below, outside the task group, unwrapped
                finally:
                    self._sessions.discard(tg.cancel_scope)
                    tg.cancel_scope.cancel()
        if self.shutting_down.is_set() and error is None:
            error = _Unavailable(f"worker {self.info.name} is shutting down; the session was ended")
        if error is not None:
            raise error


class _Unavailable(Exception):
    """The worker is going away; the session ends with UNAVAILABLE."""


async def _read_requests(
    requests: AsyncIterator[bytes], inbox: MemoryObjectSendStream[tuple[int, bytes]]
) -> None:
    """Move raw messages into the inbox as they arrive, stamped with their arrival time.

    The inbox closes when the coordinator half-closes the stream; a broken
    stream ends the session the same way (gRPC reports it to the client).
    """
    async with inbox:
        try:
            async for raw in requests:
                await inbox.send((time.perf_counter_ns(), raw))
        except (grpc.RpcError, anyio.BrokenResourceError, anyio.ClosedResourceError) as err:
            log.info("session stream ended: %s", err)


class _SessionLoop:
    """Parses, drafts and replies for one stream."""

    def __init__(self, service: DraftService, context: grpc.aio.ServicerContext) -> None:
        self.service = service
        self.context = context
        self.session: DraftSession | None = None
        self.received = 0
        self.sent = 0
        self.last_send_ns = 0

    async def run(self, inbox: MemoryObjectReceiveStream[tuple[int, bytes]]) -> None:
        async for arrived, raw in inbox:
            self.received += 1
            t0 = time.perf_counter_ns()
            request = _parse(raw)
            deserialize_ns = time.perf_counter_ns() - t0
            if self.session is None:
                await self._open(request, arrived, deserialize_ns)
            else:
                await self._round(request, arrived, deserialize_ns)

    async def _open(self, request: pb.DraftRequest, arrived: int, deserialize_ns: int) -> None:
        if request.WhichOneof("kind") != "open":
            raise InvalidArgumentError("the first message of a session must be Open")
        service = self.service
        session = DraftSession(service.model, request.open, service.totals)
        self.session = session
        service.totals.sessions_opened += 1
        prefill_ns = await service.compute.run(session.prefill)
        await self._write(
            pb.DraftReply(opened=pb.Opened(identity=service.info.identity(), prefill_ns=prefill_ns))
        )
        computed = await service.compute.run(session.first_drafts)
        await self._reply(computed, 0, computed.started_ns - deserialize_ns, deserialize_ns)

    async def _round(self, request: pb.DraftRequest, arrived: int, deserialize_ns: int) -> None:
        if request.WhichOneof("kind") != "round":
            raise InvalidArgumentError("after Open, every message of a session must be a Round")
        assert self.session is not None
        computed = await self.service.compute.run(self.session.round, request.round)
        await self._reply(computed, request.round.seq, arrived, deserialize_ns)

    async def _reply(self, computed: Computed, seq: int, arrived: int, deserialize_ns: int) -> None:
        """Encode and send the Drafts of round ``seq`` with this reply's own timing.

        ``arrived`` is when the request came off the stream; for round 0 (sent
        unasked after the prefill) it is set so that queueing counts as zero.
        """
        assert self.session is not None
        s = self.session
        t0 = time.perf_counter_ns()
        block = computed.block
        msg = drafts_to_pb(seq, block)
        msg.counters.CopyFrom(
            pb.SessionCounters(
                messages_received=self.received,
                messages_sent=self.sent,
                rounds=s.rounds,
                forward_passes=s.forward_passes,
                draft_tokens=s.draft_tokens,
            )
        )
        msg.timing.CopyFrom(
            pb.ServerTiming(
                deserialize_ns=deserialize_ns,
                receive_to_start_ns=max(0, computed.started_ns - arrived - deserialize_ns),
                compute_ns=computed.finished_ns - computed.started_ns,
                compute_to_reply_ns=t0 - computed.finished_ns,
                previous_send_ns=self.last_send_ns,
            )
        )
        body = pb.DraftReply(drafts=msg).SerializeToString()
        # A message cannot contain its own encoding time; protobuf merges a
        # repeated embedded message on parse, so the figure rides in a tail.
        serialize_ns = time.perf_counter_ns() - t0
        tail = pb.DraftReply(drafts=pb.Drafts(timing=pb.ServerTiming(serialize_ns=serialize_ns)))
        await self._send(body + tail.SerializeToString())

    async def _write(self, reply: pb.DraftReply) -> None:
        await self._send(reply.SerializeToString())

    async def _send(self, data: bytes) -> None:
        t_send = time.perf_counter_ns()
        await self.context.write(data)
        self.last_send_ns = time.perf_counter_ns() - t_send
        self.sent += 1


def _parse(raw: bytes) -> pb.DraftRequest:
    try:
        return pb.DraftRequest.FromString(raw)
    except DecodeError as err:
        raise InvalidArgumentError(f"malformed DraftRequest ({len(raw)} bytes): {err}") from err


def _plain(value: object) -> bool:
    """True for values msgpack can carry as-is (model args are simple)."""
    return isinstance(value, (int, float, str, bool, list, dict, type(None)))
