"""Timing records: plain dataclasses that the engine, the bench and the attribution read.

Each side measures with ``time.perf_counter_ns()`` on its own clock. Worker
figures travel as durations; a coordinator never subtracts a worker timestamp
from one of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServerTiming:
    """A worker's own durations for one reply (ns, worker clock)."""

    deserialize_ns: int = 0
    receive_to_start_ns: int = 0
    compute_ns: int = 0
    compute_to_reply_ns: int = 0
    serialize_ns: int = 0
    previous_send_ns: int = 0

    @property
    def handled_ns(self) -> int:
        """Worker time from having the request to having the reply encoded."""
        return (
            self.deserialize_ns
            + self.receive_to_start_ns
            + self.compute_ns
            + self.compute_to_reply_ns
            + self.serialize_ns
        )


@dataclass(frozen=True)
class CallRecord:
    """One remote call (or one message exchange on a stream), seen from the client.

    ``send_ns`` and ``receive_ns`` are client timestamps: the request handed to
    gRPC, and the reply parsed and in hand. ``server`` holds the worker's
    durations for the same call.
    """

    kind: str
    send_ns: int
    receive_ns: int
    serialize_ns: int
    deserialize_ns: int
    bytes_sent: int
    bytes_received: int
    server: ServerTiming = field(default_factory=ServerTiming)

    @property
    def wall_ns(self) -> int:
        """Client-side wall time of the call, send to reply in hand."""
        return self.receive_ns - self.send_ns
