"""Measuring the link to a worker: raw TCP echo, gRPC echo, and bulk throughput.

The raw TCP figures are the network floor the bench attributes against: what
bare TCP costs on this path for a given payload. The gRPC echoes (unary, and
messages on one stream) cost the same bytes plus gRPC's own work, so the
difference is gRPC-over-TCP overhead. Every measurement is bounded by a
sample count and a time budget. Runs on the event loop.
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field

import anyio
import numpy as np

from coordinator.workers.connection import WorkerConnection
from specwire.errors import AuthenticationError, RemoteWorkerError
from specwire.wire.auth import ECHO_METHOD as ECHO_PROOF_METHOD
from specwire.wire.auth import caller_proof
from specwire.wire.echo_frames import (
    AUTHENTICATE,
    DOWNLOAD,
    ECHO,
    HEADER,
    LENGTH,
    UPLOAD,
    no_delay,
    recv_exactly,
    send_zeros,
)
from specwire.wire.protocol import ECHO_METHOD, ECHO_STREAM_METHOD

DEFAULT_SIZES = (16, 256, 4096, 65536, 1 << 20)
CONNECT_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RttSummary:
    """Round-trip times of one payload size, in microseconds."""

    size: int
    samples: int
    min_us: float
    p50_us: float
    p95_us: float
    p99_us: float
    mean_us: float

    @classmethod
    def of(cls, size: int, samples_ns: list[int]) -> RttSummary:
        """Summarise raw samples (ns)."""
        us = np.asarray(samples_ns, dtype=np.float64) / 1e3
        return cls(
            size=size,
            samples=len(us),
            min_us=float(us.min()),
            p50_us=float(np.percentile(us, 50)),
            p95_us=float(np.percentile(us, 95)),
            p99_us=float(np.percentile(us, 99)),
            mean_us=float(us.mean()),
        )


@dataclass
class ProbeReport:
    """Everything one probe of one worker measured."""

    worker: str
    grpc_address: str
    echo_address: str
    tcp: list[RttSummary] = field(default_factory=list)
    grpc_unary: list[RttSummary] = field(default_factory=list)
    grpc_stream: list[RttSummary] = field(default_factory=list)
    upload_bytes_per_s: float = 0.0
    download_bytes_per_s: float = 0.0

    def to_dict(self) -> dict:
        """Plain data for JSON."""
        return asdict(self)


class TcpEcho:
    """A blocking connection to a worker's raw TCP echo service (use it from a thread)."""

    def __init__(self, host: str, port: int, token: str | None) -> None:
        try:
            self.sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except OSError as err:
            raise RemoteWorkerError(
                f"echo service at {host}:{port} is unreachable ({err})", "UNAVAILABLE"
            ) from err
        self.sock.settimeout(CALL_TIMEOUT_S)
        no_delay(self.sock)
        self.buffer = bytearray(1 << 16)
        if token is not None:
            self._authenticate(token, f"{host}:{port}")

    def _authenticate(self, token: str, where: str) -> None:
        proof = caller_proof(token, ECHO_PROOF_METHOD).encode()
        self.sock.sendall(HEADER.pack(AUTHENTICATE, len(proof)) + proof)
        try:
            self._length()
        except (ConnectionError, OSError) as err:
            raise AuthenticationError(f"echo service at {where} refused the token proof") from err

    def _reply(self, length: int) -> None:
        if len(self.buffer) < length:
            self.buffer = bytearray(length)
        recv_exactly(self.sock, memoryview(self.buffer)[:length])

    def _length(self) -> int:
        self._reply(LENGTH.size)
        return int(LENGTH.unpack_from(self.buffer)[0])

    def echo(self, payload: bytes) -> int:
        """One echo round trip; returns its duration in ns."""
        t0 = time.perf_counter_ns()
        self.sock.sendall(HEADER.pack(ECHO, len(payload)))
        self.sock.sendall(payload)
        self._reply(self._length())
        return time.perf_counter_ns() - t0

    def upload(self, nbytes: int) -> int:
        """Send ``nbytes`` and wait for the acknowledgement; returns ns."""
        t0 = time.perf_counter_ns()
        self.sock.sendall(HEADER.pack(UPLOAD, nbytes))
        send_zeros(self.sock, nbytes)
        self._length()
        return time.perf_counter_ns() - t0

    def download(self, nbytes: int) -> int:
        """Ask for ``nbytes`` and receive them; returns ns."""
        t0 = time.perf_counter_ns()
        self.sock.sendall(HEADER.pack(DOWNLOAD, nbytes))
        self._reply(self._length())
        return time.perf_counter_ns() - t0

    def close(self) -> None:
        """Close the connection."""
        self.sock.close()


def _sample(run: Callable[[], int], count: int, budget_s: float) -> list[int]:
    """Call ``run()`` up to ``count`` times within ``budget_s`` (at least twice); returns ns samples."""
    samples: list[int] = []
    deadline = time.monotonic() + budget_s
    while len(samples) < count and (len(samples) < 2 or time.monotonic() < deadline):
        samples.append(run())
    return samples[1:]  # the first round trip warms the path up


def _tcp_round_trips(
    host: str, port: int, sizes: tuple[int, ...], count: int, budget_s: float, token: str | None
) -> list[RttSummary]:
    echo = TcpEcho(host, port, token)
    try:
        return [
            RttSummary.of(size, _sample(functools.partial(echo.echo, bytes(size)), count, budget_s))
            for size in sizes
        ]
    finally:
        echo.close()


async def probe_tcp(
    host: str, port: int, sizes: tuple[int, ...], count: int, budget_s: float, token: str | None = None
) -> list[RttSummary]:
    """Raw TCP echo round trips for each payload size (measured on a thread, off the event loop)."""
    return await anyio.to_thread.run_sync(_tcp_round_trips, host, port, sizes, count, budget_s, token)


async def _sample_async(run: Callable[[], Awaitable[int]], count: int, budget_s: float) -> list[int]:
    samples: list[int] = []
    deadline = time.monotonic() + budget_s
    while len(samples) < count and (len(samples) < 2 or time.monotonic() < deadline):
        samples.append(await run())
    return samples[1:]


async def probe_grpc(
    connection: WorkerConnection, sizes: tuple[int, ...], count: int, budget_s: float
) -> tuple[list[RttSummary], list[RttSummary]]:
    """gRPC echo round trips: unary calls (each with its own token proof), and messages on one stream."""
    channel, credentials = connection.channel, connection.credentials
    unary_call = channel.unary_unary(ECHO_METHOD)
    stream = channel.stream_stream(ECHO_STREAM_METHOD)(
        timeout=CALL_TIMEOUT_S * 10, metadata=credentials.metadata(ECHO_STREAM_METHOD)
    )
    unary, streamed = [], []

    async def one_unary(payload: bytes) -> int:
        t0 = time.perf_counter_ns()
        await unary_call(payload, timeout=CALL_TIMEOUT_S, metadata=credentials.metadata(ECHO_METHOD))
        return time.perf_counter_ns() - t0

    async def one_streamed(payload: bytes) -> int:
        t0 = time.perf_counter_ns()
        await stream.write(payload)
        with anyio.fail_after(CALL_TIMEOUT_S):
            await stream.read()
        return time.perf_counter_ns() - t0

    try:
        for size in sizes:
            payload = bytes(size)
            unary.append(
                RttSummary.of(
                    size, await _sample_async(functools.partial(one_unary, payload), count, budget_s)
                )
            )
            streamed.append(
                RttSummary.of(
                    size, await _sample_async(functools.partial(one_streamed, payload), count, budget_s)
                )
            )
    finally:
        stream.cancel()
    return unary, streamed


THROUGHPUT_REPEATS = 3


def _throughput(host: str, port: int, nbytes: int, token: str | None) -> tuple[float, float]:
    echo = TcpEcho(host, port, token)
    try:
        echo.upload(min(nbytes, 1 << 20))  # warm-up
        ups, downs = [], []
        for _ in range(THROUGHPUT_REPEATS):  # interleaved, so a busy spell hits both directions alike
            ups.append(echo.upload(nbytes))
            downs.append(echo.download(nbytes))
        return nbytes / (min(ups) / 1e9), nbytes / (min(downs) / 1e9)
    finally:
        echo.close()


async def probe_throughput(
    host: str, port: int, nbytes: int, token: str | None = None
) -> tuple[float, float]:
    """Bulk throughput (bytes/s) towards the worker and back from it.

    The best of ``THROUGHPUT_REPEATS`` transfers each way: load on either host
    only ever slows a transfer, so the fastest one is the closest to what the
    link carries.
    """
    return await anyio.to_thread.run_sync(_throughput, host, port, nbytes, token)


class NetworkFloor:
    """What bare TCP costs on one path, by payload size (the probe's p50 echo round trips)."""

    def __init__(self, tcp: list[RttSummary]) -> None:
        ordered = sorted(tcp, key=lambda s: s.size)
        self.sizes = np.array([s.size for s in ordered], dtype=np.float64)
        self.rtt_ns = np.array([s.p50_us * 1e3 for s in ordered], dtype=np.float64)

    def echo_ns(self, size: int) -> float:
        """Round trip of an echo of ``size`` bytes each way, interpolated (extrapolated past the end)."""
        if size >= self.sizes[-1] and len(self.sizes) > 1:
            slope = (self.rtt_ns[-1] - self.rtt_ns[-2]) / (self.sizes[-1] - self.sizes[-2])
            return float(self.rtt_ns[-1] + slope * (size - self.sizes[-1]))
        return float(np.interp(size, self.sizes, self.rtt_ns))

    def call_ns(self, sent: int, received: int) -> float:
        """Bare-TCP cost of a call that moves ``sent`` bytes up and ``received`` bytes down.

        An echo of s bytes moves s each way, so each direction costs about half
        of it: the floor is the mean of the two echoes' round trips.
        """
        return (self.echo_ns(sent) + self.echo_ns(received)) / 2
