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
    arrived_at_ns: int = 0  # instants on the worker's clock: same-host breakdowns only
    encoded_at_ns: int = 0

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

    ``send_ns`` and ``receive_ns`` are client timestamps: the request encoded
    and about to be handed to gRPC, and the reply parsed and in hand.
    ``server`` holds the worker's durations for the same call. The optional
    instants around them (0 when not taken) let a round be broken down
    (``scripts/measure/round_breakdown.py``): ``requested_ns`` the engine asking on
    the compute thread, ``entered_ns`` the event loop taking the call up,
    ``written_ns`` gRPC accepting the write, ``read_ns`` the raw reply coming
    off the stream, ``returned_ns`` the compute thread holding the drafts.
    """

    kind: str
    send_ns: int
    receive_ns: int
    serialize_ns: int
    deserialize_ns: int
    bytes_sent: int
    bytes_received: int
    server: ServerTiming = field(default_factory=ServerTiming)
    requested_ns: int = 0
    entered_ns: int = 0
    written_ns: int = 0
    read_ns: int = 0
    returned_ns: int = 0

    @property
    def wall_ns(self) -> int:
        """Client-side wall time of the call, send to reply in hand."""
        return self.receive_ns - self.send_ns
