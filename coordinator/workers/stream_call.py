"""A bidirectional gRPC stream to a worker, carrying raw bytes, with deadlines and clear errors.

Both remote backends run one session per stream and encode their messages
themselves (to time it); this class is the part they share: opening the
call with a session deadline, writing, reading with a per-message deadline,
and turning every way a stream can end into a ``RemoteWorkerError`` that
names the worker and says what was going on. Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import TypeVar

import anyio
import grpc
from google.protobuf.message import DecodeError, Message

from coordinator.workers.connection import WorkerConnection
from coordinator.workers.errors import remote_error, timeout_error
from specwire.errors import RemoteWorkerError

M = TypeVar("M", bound=Message)

SESSION_TIMEOUT_S = 6 * 3600.0
CLOSE_TIMEOUT_S = 5.0


class StreamCall:
    """One open stream: ``write`` and ``read`` raw messages."""

    def __init__(self, connection: WorkerConnection, method: str, read_timeout: float) -> None:
        self.connection = connection
        self.read_timeout = read_timeout
        metadata = connection.credentials.metadata(method)
        self._call = connection.channel.stream_stream(method)(timeout=SESSION_TIMEOUT_S, metadata=metadata)

    @property
    def worker(self) -> str:
        """The worker's name, for messages."""
        return self.connection.name

    async def write(self, data: bytes, action: str) -> int:
        """Send one message; returns when gRPC took it (perf_counter_ns)."""
        if self._call.done():  # the worker already ended the session; say why
            raise await self.ended(action)
        try:
            await self._call.write(data)
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as err:
            # A write fails when the stream is over; the status the worker sent says why.
            raise await self.ended(action) from err
        return time.perf_counter_ns()

    async def read(self, action: str) -> tuple[bytes, int]:
        """Receive one message; returns it and the time it was in hand (perf_counter_ns)."""
        try:
            with anyio.fail_after(self.read_timeout):
                raw = await self._call.read()
        except TimeoutError as err:
            self._call.cancel()
            raise timeout_error(self.worker, action, self.read_timeout) from err
        except grpc.RpcError as err:
            raise remote_error(err, self.worker, action) from err
        if raw is grpc.aio.EOF:
            raise await self.ended(action)
        return raw, time.perf_counter_ns()

    async def read_message(self, kind: type[M], action: str) -> tuple[M, int, int, int, int]:
        """Receive and parse one ``kind`` message.

        Returns it, its size, the parse time, and when it came off the stream
        and when it was parsed (perf_counter_ns).
        """
        raw, read_at = await self.read(action)
        t0 = time.perf_counter_ns()
        try:
            message = kind.FromString(raw)
        except DecodeError as err:
            raise RemoteWorkerError(
                f"worker {self.worker} sent a malformed reply: {err}", "INTERNAL"
            ) from err
        t1 = time.perf_counter_ns()
        return message, len(raw), t1 - t0, read_at, t1

    async def ended(self, action: str) -> RemoteWorkerError:
        """The error for a stream that is over: the status the worker sent, read off the stream."""
        try:
            with anyio.fail_after(CLOSE_TIMEOUT_S):
                while await self._call.read() is not grpc.aio.EOF:
                    pass
                code, details = await self._call.code(), await self._call.details()
        except grpc.RpcError as err:
            return remote_error(err, self.worker, action)
        except TimeoutError:
            return timeout_error(self.worker, action, CLOSE_TIMEOUT_S)
        return RemoteWorkerError(
            f"worker {self.worker} ended the session while {action} ({code.name}): {details}", code.name
        )

    def cancel(self) -> None:
        """Drop the stream at once (the worker frees the session when it notices)."""
        self._call.cancel()

    async def close(self) -> None:
        """Half-close and wait briefly for the worker to end the session; cancel if it does not.

        Replies not read yet (a session closed before its first round's drafts were asked for) are read
        and dropped first: the call's status comes after them, and waiting for it alone waited out the
        whole timeout."""
        if self._call.done():
            return
        try:
            await self._call.done_writing()
            with anyio.move_on_after(CLOSE_TIMEOUT_S):
                while await self._call.read() is not grpc.aio.EOF:
                    pass
                await self._call.code()
                return
        except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            return
        self._call.cancel()
