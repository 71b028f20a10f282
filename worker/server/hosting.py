"""Hosting streaming sessions: admission, reading, shutdown and error status.

Both backends (the stream protocol and the per-op tensor executor) run one
session per bidirectional stream and share this machinery: a session slot
out of ``--max-sessions``, the loop that reads each message (stamping its
arrival) and handles it, a task group for a session's background work
(pre-speculation drafts ahead while the loop waits for the next message),
cancellation when the worker shuts down, and the mapping of errors to a
gRPC status.

Messages are read between handling them, not by a reader task of their own:
both protocols send one message and wait for its reply, and passing each
message from a reader task to the session cost about 0.1 ms per round on a
2-core machine (two more event-loop iterations, and the next read's set-up
ahead of the round; ``scripts/measure/round_breakdown.py``).

Messages are raw bytes: each backend parses and encodes its own, and reports
those durations in its replies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
import grpc
from google.protobuf.message import Message

from specwire.errors import CapacityError, SessionIdleError, SpecwireError, WorkerFault
from specwire.v1 import draft_pb2 as pb
from worker.server.status import status_for

log = logging.getLogger(__name__)
REFUSAL_READ_S = 1.0  # how long a refused session's first message is awaited (_opening_read)


@dataclass(frozen=True)
class WorkerInfo:
    """Who this worker is; fixed at start."""

    name: str
    label: str
    backends: tuple[str, ...]
    draft_tps: float
    max_sessions: int
    echo_port: int = 0
    pass_curve: tuple[tuple[int, float], ...] = ()  # (rows, seconds) of a tree pass (worker.server.speed)
    walked_ops: int = (
        0  # operations of one pass in the per-op baseline (worker.per_op.op_walk); 0: not offered
    )
    unwalked: str = ""  # why the per-op baseline cannot split the model's pass, when it cannot
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def identity(self) -> pb.WorkerIdentity:
        """This worker as a protocol message."""
        return pb.WorkerIdentity(
            name=self.name, label=self.label, host=self.host, pid=self.pid, boot_id=self.boot_id
        )


@dataclass
class WorkerCounters:
    """Process-wide counters, reported by Hello."""

    sessions_opened: int = 0
    sessions_active: int = 0
    forward_passes: int = 0
    draft_tokens: int = 0
    prespec_hits: int = 0
    prespec_partial: int = 0
    prespec_misses: int = 0
    speculative_passes: int = 0


class SessionEnded(Exception):
    """The worker is going away; the session ends with UNAVAILABLE."""


class StreamLoop:
    """Handles the messages of one stream; subclasses implement ``handle``.

    It counts messages both ways and times each reply's hand-off to the
    transport, so every reply can report the previous one's send time.
    """

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.context = context
        self.received = 0
        self.sent = 0
        self.last_send_ns = 0
        self.tasks: anyio.abc.TaskGroup | None = None  # the session's, for background work

    async def handle(self, arrived_ns: int, raw: bytes) -> None:
        """Handle one raw message that came off the stream at ``arrived_ns``."""
        raise NotImplementedError

    async def send(self, data: bytes) -> None:
        """Write one encoded reply and time its hand-off."""
        t_send = time.perf_counter_ns()
        await self.context.write(data)
        self.last_send_ns = time.perf_counter_ns() - t_send
        self.sent += 1


class SessionHost:
    """Admits and runs the sessions of one worker process, for every backend."""

    def __init__(self, info: WorkerInfo, totals: WorkerCounters, idle_timeout_s: float = 300.0) -> None:
        self.info = info
        self.totals = totals
        self.idle_timeout_s = idle_timeout_s
        self.shutting_down = anyio.Event()
        self._scopes: set[anyio.CancelScope] = set()

    async def shutdown(self) -> None:
        """End every open session with UNAVAILABLE; new sessions are refused."""
        self.shutting_down.set()
        for scope in list(self._scopes):
            scope.cancel()

    async def serve(self, requests: AsyncIterator[bytes], loop: StreamLoop) -> None:
        """Run one session to its end and set the stream's status from how it ended."""
        context = loop.context
        try:
            await self._admit(requests)
            self.totals.sessions_active += 1
            try:
                await self._run(requests, loop)
            finally:
                self.totals.sessions_active -= 1
        except SpecwireError as err:
            log.info("session refused or ended: %s", err)
            context.set_code(status_for(err))
            context.set_details(str(err))
        except SessionEnded as err:
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details(str(err))

    async def _admit(self, requests: AsyncIterator[bytes]) -> None:
        """Raise why a new session is refused, once its first message is read (``_opening_read``)."""
        refusal = self._refusal()
        if refusal is not None:
            await _opening_read(requests)
            raise refusal

    def _refusal(self) -> SpecwireError | SessionEnded | None:
        if self.shutting_down.is_set():
            return SessionEnded(f"worker {self.info.name} is shutting down")
        if self.totals.sessions_active >= self.info.max_sessions:
            return CapacityError(
                f"worker {self.info.name} is serving its maximum of {self.info.max_sessions} sessions"
            )
        return None

    async def _run(self, requests: AsyncIterator[bytes], loop: StreamLoop) -> None:
        error: BaseException | None = None
        async with anyio.create_task_group() as tg:
            self._scopes.add(tg.cancel_scope)
            loop.tasks = tg
            try:
                await _drain(requests, loop, self.idle_timeout_s)
            except (SpecwireError, SessionEnded) as err:
                error = err  # re-raised below, outside the task group, unwrapped
            except Exception as err:  # a bug must end this session, not the worker
                log.exception("session failed")
                error = WorkerFault(f"worker {self.info.name} failed: {type(err).__name__}: {err}")
            finally:
                self._scopes.discard(tg.cancel_scope)
                tg.cancel_scope.cancel()
        if self.shutting_down.is_set() and error is None:
            error = SessionEnded(f"worker {self.info.name} is shutting down; the session was ended")
        if error is not None:
            raise error


async def _opening_read(requests: AsyncIterator[bytes]) -> None:
    """Read the client's first message (for at most ``REFUSAL_READ_S``) before its session is refused.

    A refusal sent before the client's first write lands races that write, and grpc's asyncio client
    then reports INTERNAL ("Internal error from Core", grpc/grpc#36066) instead of the refusal: 3 of
    300 refused opens here. Once the worker has read the Open, the write is done.
    """
    with anyio.move_on_after(REFUSAL_READ_S), contextlib.suppress(StopAsyncIteration, grpc.RpcError):
        await anext(aiter(requests))


async def _drain(requests: AsyncIterator[bytes], loop: StreamLoop, idle_s: float) -> None:
    """Read and handle messages until the stream ends; a session silent for ``idle_s`` is freed.

    The stream ends when the coordinator half-closes it; a broken stream ends
    the session the same way (gRPC reports it to the client).
    """
    messages = aiter(requests)
    while True:
        try:
            with anyio.fail_after(idle_s):
                raw = await anext(messages)
        except StopAsyncIteration:
            return
        except TimeoutError as err:
            raise SessionIdleError(f"session idle for {idle_s:g} s; closed to free its KV cache") from err
        except grpc.RpcError as err:
            log.info("session stream ended: %s", err)
            return
        loop.received += 1
        await loop.handle(time.perf_counter_ns(), raw)


def server_timing(
    deserialize_ns: int,
    arrived_ns: int,
    started_ns: int,
    finished_ns: int,
    reply_ns: int,
    previous_send_ns: int,
) -> pb.ServerTiming:
    """The worker's durations for one reply (all on the worker's clock)."""
    return pb.ServerTiming(
        deserialize_ns=deserialize_ns,
        receive_to_start_ns=max(0, started_ns - arrived_ns - deserialize_ns),
        compute_ns=finished_ns - started_ns,
        compute_to_reply_ns=max(0, reply_ns - finished_ns),
        previous_send_ns=previous_send_ns,
        arrived_at_ns=arrived_ns,
    )


def encode_timed(envelope: Message, tail_for: Callable[[pb.ServerTiming], Message], started_ns: int) -> bytes:
    """Encode ``envelope``, then append its own encoding time.

    A message cannot contain the time it took to encode it. Protobuf merges a
    repeated embedded message on parse, so the figure rides in a small tail
    message (``tail_for`` wraps a ServerTiming the way ``envelope`` does).
    """
    body = envelope.SerializeToString()
    encoded_at = time.perf_counter_ns()
    tail = tail_for(pb.ServerTiming(serialize_ns=encoded_at - started_ns, encoded_at_ns=encoded_at))
    return body + tail.SerializeToString()
