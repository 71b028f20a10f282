"""The stream protocol, worker side: ``DraftWorker.Hello`` and ``DraftWorker.Draft``.

One Draft stream is one session (hosted by ``worker.server.hosting``). Each message
is parsed here, the drafter runs on the worker's compute thread, and the reply is
encoded here with the worker's own durations (parse, queueing, compute, hop
back to the event loop, encode, previous send) and the session's counters.

Pre-speculation: after each reply a background task of the session runs
speculative passes one compute job at a time, so it can stop between any
two. When the next Round arrives, a finished branch is answered at once,
even while a pass is still in flight; otherwise speculation stops, the
in-flight pass ends, and the round is drafted (finishing a branch under way
when there is one, or serving it whole if that pass finished it). In fill
mode every Round is answered at once with what is ready, and the rest of the
block is drafted after the reply, as the first background passes
(``worker.stream.session``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import grpc
import msgpack
from google.protobuf.message import DecodeError

from specwire.drafting.ahead.draft_tree import TreeMemory
from specwire.drafting.ahead.prespec_config import PrespecConfig
from specwire.drafting.prefix_cache import PrefixCache
from specwire.emulation.pace import Pace, PaceCounts, Pacer
from specwire.errors import BackendUnavailableError, InvalidArgumentError
from specwire.models.loading import LoadedModel
from specwire.process.compute import ComputeThread
from specwire.process.memory import current_rss_bytes, peak_rss_bytes
from specwire.v1 import draft_pb2 as pb
from specwire.wire.auth import worker_proof
from specwire.wire.protocol import BACKEND_STREAM, PROTOCOL_VERSION, SERVICE_NAME, drafts_to_pb, pace_to_pb
from worker.server.auth import caller_proof_of
from worker.server.hosting import SessionHost, StreamLoop, encode_timed, server_timing
from worker.server.status import status_for
from worker.stream.computed import Computed
from worker.stream.session import DraftSession
from worker.stream.window import LATE_S


class DraftService:
    """Serves one draft model to many concurrent sessions over the stream protocol."""

    def __init__(
        self,
        model: LoadedModel,
        host: SessionHost,
        compute: ComputeThread,
        token: str | None,
        prespec: PrespecConfig | None = None,
        pace: Pace | None = None,
        pacer: Pacer | None = None,
        prompt_cache: PrefixCache | None = None,
    ) -> None:
        self.model = model
        self.prompt_cache = (
            prompt_cache  # each coordinator's prefills, under the key it sends (Open.cache_key)
        )
        self.host = host
        self.compute = compute
        self.token = token
        self.prespec = prespec or PrespecConfig()
        self.tree_memory = TreeMemory(self.prespec.tree_memory)  # shared by every session's tree
        self.pace = pace
        self.pacer = pacer

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
                # Echoes send back the encoded message untouched: no parsing, only gRPC's own cost.
                "Echo": grpc.unary_unary_rpc_method_handler(_echo),
                "EchoStream": grpc.stream_stream_rpc_method_handler(_echo_stream),
            },
        )

    async def hello(self, request: pb.HelloRequest, context: grpc.aio.ServicerContext) -> pb.HelloReply:
        """Describe this worker and its model."""
        config = msgpack.packb({k: v for k, v in self.model.args.items() if _plain(v)})
        info, t = self.host.info, self.host.totals
        paced = self.pacer.snapshot() if self.pacer is not None else PaceCounts()
        return pb.HelloReply(
            protocol_version=PROTOCOL_VERSION,
            identity=info.identity(),
            model=pb.ModelInfo(
                spec=self.model.spec,
                fingerprint=self.model.fingerprint,
                precision=self.model.precision,
                vocab_size=self.model.vocab_size,
                context_length=self.model.context_length,
                config_msgpack=config,
                walked_ops=info.walked_ops,
                unwalked=info.unwalked,
            ),
            backends=list(info.backends),
            draft_tokens_per_second=info.draft_tps,
            max_sessions=info.max_sessions,
            counters=pb.WorkerCounters(
                sessions_opened=t.sessions_opened,
                sessions_active=t.sessions_active,
                forward_passes=t.forward_passes,
                draft_tokens=t.draft_tokens,
                peak_rss_bytes=peak_rss_bytes(),
                rss_bytes=current_rss_bytes(),
                prespec_hits=t.prespec_hits,
                prespec_partial=t.prespec_partial,
                prespec_misses=t.prespec_misses,
                speculative_passes=t.speculative_passes,
                paced_passes=paced.passes,
                pace_overruns=paced.overruns,
                pace_headroom=paced.headroom,
            ),
            echo_port=info.echo_port,
            auth_proof=worker_proof(self.token, caller_proof_of(context)) if self.token else "",
            pace=pace_to_pb(self.pace),
            compute="thread",
            pass_curve=[pb.PassTime(rows=n, seconds=s) for n, s in info.pass_curve],
            tree_replies=bool(info.pass_curve),  # a model that can draft a tree answers with one
        )

    async def draft(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        """One session: read messages, draft, reply, until the stream ends."""
        if BACKEND_STREAM not in self.host.info.backends:
            context.set_code(status_for(BackendUnavailableError()))
            context.set_details(f"worker {self.host.info.name} does not offer the {BACKEND_STREAM} backend")
            return
        await self.host.serve(requests, _DraftLoop(self, context))


class _DraftLoop(StreamLoop):
    """Parses, drafts and replies for one Draft stream."""

    def __init__(self, service: DraftService, context: grpc.aio.ServicerContext) -> None:
        super().__init__(context)
        self.service = service
        self.session: DraftSession | None = None
        self._stop_speculating = False
        self._speculation_done: anyio.Event | None = None

    async def handle(self, arrived_ns: int, raw: bytes) -> None:
        t0 = time.perf_counter_ns()
        request = _parse(raw)
        deserialize_ns = time.perf_counter_ns() - t0
        kind = request.WhichOneof("kind")
        if self.session is None:
            if kind != "open":
                raise InvalidArgumentError("the first message of a session must be Open")
            await self._open(request.open, deserialize_ns)
        elif kind == "verifying":
            self.session.verifying(request.verifying)
            return  # the passes under way go on, now timed to end by the verdict
        else:
            if kind != "round":
                raise InvalidArgumentError(
                    "after Open, every message of a session must be a Round or Verifying"
                )
            msg = request.round
            if self.session.fill:
                self.session.note_round(arrived_ns)
                if self.session.pass_ends_within(LATE_S):
                    await self._stop()  # a pass about to publish the verdict's drafts: worth the wait
                answer = self.session.answer_ready(msg)
                await self._reply(answer.computed, msg.seq, arrived_ns, deserialize_ns)
                await self._stop()
                await self.service.compute.run(self.session.settle_ready, answer)
            else:
                computed = self.session.serve_hit(msg)
                if computed is None:
                    await self._stop()  # the pass in flight may finish the branch: then it is a hit
                    computed = self.session.serve_hit(msg)
                if computed is None:
                    computed = await self.service.compute.run(self.session.round, msg)
                await self._reply(computed, msg.seq, arrived_ns, deserialize_ns)
                await self._stop()
        self._speculate()

    def _speculate(self) -> None:
        """Plan the next round's branches and draft them in the background."""
        session = self.session
        if session is None or not session.speculates or self.tasks is None:
            return
        session.plan_speculation()
        self._stop_speculating = False
        done = self._speculation_done = anyio.Event()
        self.tasks.start_soon(self._speculation, session, done)

    async def _speculation(self, session: DraftSession, done: anyio.Event) -> None:
        try:
            while not self._stop_speculating and await self.service.compute.run(self._passes, session):
                pass
        finally:
            done.set()

    def _passes(self, session: DraftSession) -> bool:
        """Speculative passes back to back while no other job waits for the compute thread (a hop back
        to the event loop between two passes cost about a millisecond of the window on a 2-core
        machine); False once there is nothing more to do. Compute thread."""
        while session.speculate():
            if self._stop_speculating or not self.service.compute.idle:
                return True
        return False

    async def _stop(self) -> None:
        """Stop speculating and wait for the pass in flight, if any."""
        self._stop_speculating = True
        if self._speculation_done is not None:
            await self._speculation_done.wait()

    async def _open(self, msg: pb.Open, deserialize_ns: int) -> None:
        service = self.service
        totals = service.host.totals
        session = DraftSession(
            service.model,
            msg,
            totals,
            service.prespec,
            service.pacer,
            service.tree_memory,
            service.host.info.pass_curve,
            service.prompt_cache,
        )
        self.session = session
        totals.sessions_opened += 1
        prefill_ns = await service.compute.run(session.prefill)
        opened = pb.Opened(
            identity=service.host.info.identity(),
            prefill_ns=prefill_ns,
            cached_tokens=session.drafter.reuse.cached,
        )
        await self.send(pb.DraftReply(opened=opened).SerializeToString())
        computed = await service.compute.run(session.first_drafts)
        # Round 0 follows the prefill unasked: it did not queue behind a request.
        await self._reply(computed, 0, computed.started_ns - deserialize_ns, deserialize_ns)

    async def _reply(self, computed: Computed, seq: int, arrived_ns: int, deserialize_ns: int) -> None:
        """Encode and send the Drafts of round ``seq`` with this reply's own timing."""
        assert self.session is not None
        s = self.session
        t0 = time.perf_counter_ns()
        msg = drafts_to_pb(seq, computed.block)
        msg.counters.CopyFrom(
            pb.SessionCounters(
                messages_received=self.received,
                messages_sent=self.sent,
                rounds=s.rounds,
                forward_passes=s.forward_passes,
                draft_tokens=s.draft_tokens,
                prespec_hits=s.hits,
                prespec_partial=s.partial,
                prespec_misses=s.misses,
                speculative_passes=s.speculative_passes,
                paced_passes=s.paced_passes,
                pace_overruns=s.pace_overruns,
                pace_buckets=s.take_pace_buckets(),
            )
        )
        if s.speculates:
            passes, branches = s.speculation_state()
            msg.speculation.CopyFrom(
                pb.Speculation(
                    outcome=computed.outcome,  # type: ignore[arg-type]
                    saved_ns=computed.saved_ns,
                    speculative_passes=passes,
                    branches=branches,
                )
            )
        msg.timing.CopyFrom(
            server_timing(
                deserialize_ns, arrived_ns, computed.started_ns, computed.finished_ns, t0, self.last_send_ns
            )
        )
        data = encode_timed(
            pb.DraftReply(drafts=msg), lambda timing: pb.DraftReply(drafts=pb.Drafts(timing=timing)), t0
        )
        await self.send(data)
        s.clock.replied(time.perf_counter_ns())


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def _echo_stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


def _parse(raw: bytes) -> pb.DraftRequest:
    try:
        return pb.DraftRequest.FromString(raw)
    except DecodeError as err:
        raise InvalidArgumentError(f"malformed DraftRequest ({len(raw)} bytes): {err}") from err


def _plain(value: object) -> bool:
    """True for values msgpack can carry as-is (model args are simple)."""
    return isinstance(value, (int, float, str, bool, list, dict, type(None)))
