"""One tensor-executor session over ``TensorWorker.Execute``: strictly one request, then its reply.

Like a GGML_RPC client on its TCP connection, the client sends a graph and
waits for the result before sending the next; the stream only saves setting
up a call per message. Every call is recorded (client send/receive times,
client encode/decode time, bytes each way, the worker's durations), and the
client counts calls and operations to check against the worker's counters.
Runs on the event loop.
"""

from __future__ import annotations

import time

from coordinator.workers.connection import WorkerConnection
from coordinator.workers.stream_call import StreamCall
from specwire.emulation.pace import counted
from specwire.errors import RemoteWorkerError
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import EXECUTE_METHOD, PROTOCOL_VERSION, timing_from_pb
from specwire.wire.timing import CallRecord

CALL_TIMEOUT_S = 60.0


class TensorClient:
    """A session with a worker's tensor executor."""

    def __init__(
        self, connection: WorkerConnection, fingerprint: str, timeout: float = CALL_TIMEOUT_S
    ) -> None:
        self.connection = connection
        self.fingerprint = fingerprint
        self.timeout = timeout
        self.records: list[CallRecord] = []
        self.calls = 0
        self.ops = 0
        self.worker_counters = pb.TensorCounters()
        self.pace_headroom: list[int] = []  # the worker's paced passes by headroom, over the session
        self._stream: StreamCall | None = None
        self._seq = 0

    async def open(self) -> pb.TensorOpened:
        """Open the session; returns the module handles and this session's handle tag."""
        self._stream = StreamCall(self.connection, EXECUTE_METHOD, self.timeout)
        request = pb.TensorRequest(
            open=pb.TensorOpen(protocol_version=PROTOCOL_VERSION, vocab_fingerprint=self.fingerprint)
        )
        await self._stream.write(request.SerializeToString(), "opening a tensor session")
        reply, _, _ = await self._read("opening a tensor session")
        if reply.WhichOneof("kind") != "opened":
            raise RemoteWorkerError(
                f"worker {self.connection.name} did not open the tensor session", "INTERNAL"
            )
        return reply.opened

    async def run(self, ops: list[pb.Op], kind: str) -> list[bytes]:
        """Send ``ops`` as one call and return the tensors it asked for."""
        assert self._stream is not None
        self._seq += 1
        t0 = time.perf_counter_ns()
        data = pb.TensorRequest(graph=pb.Graph(seq=self._seq, ops=ops)).SerializeToString()
        t1 = time.perf_counter_ns()
        action = f"{kind} call {self._seq}"
        await self._stream.write(data, action)
        reply, raw_len, deserialize_ns = await self._read(action)
        received_at = time.perf_counter_ns()
        result = reply.result
        if reply.WhichOneof("kind") != "result" or result.seq != self._seq:
            raise RemoteWorkerError(
                f"worker {self.connection.name} answered {action} out of turn", "INTERNAL"
            )
        self.calls += 1
        self.ops += len(ops)
        self.worker_counters = result.counters
        self.pace_headroom = counted(self.pace_headroom, result.counters.pace_buckets)
        self.records.append(
            CallRecord(
                kind=kind,
                send_ns=t1,
                receive_ns=received_at,
                serialize_ns=t1 - t0,
                deserialize_ns=deserialize_ns,
                bytes_sent=len(data),
                bytes_received=raw_len,
                server=timing_from_pb(result.timing),
            )
        )
        return list(result.tensors)

    async def close(self) -> None:
        """End the session; the worker frees its activations and KV cache."""
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()

    async def abort(self) -> None:
        """Drop the session at once."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()

    async def _read(self, action: str) -> tuple[pb.TensorReply, int, int]:
        assert self._stream is not None
        reply, size, parse_ns, _, _ = await self._stream.read_message(pb.TensorReply, action)
        return reply, size, parse_ns
