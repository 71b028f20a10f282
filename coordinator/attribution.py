"""Where the time of remote drafting goes: network, protocol, compute. One method, in one place.

For every call a draft source made during drafting rounds:

* compute  = the worker's own compute time for the call (worker clock, a duration);
* network  = what bare TCP would have cost on this path for the call's bytes:
             the LAN probe's raw-TCP echo round trip (p50) interpolated at the
             bytes sent and at the bytes received, averaged (see
             ``NetworkFloor.call_ns``);
* protocol = the call's wall time on the coordinator − compute − network: the
             encoding and decoding on both sides, HTTP/2 and gRPC framing,
             thread hops and scheduling, per-call set-up.

Wall times are measured on the coordinator's clock only; worker figures are
durations. Session openings (which carry the prompt prefill) are left out.
Totals are reported per draft token and per generated token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from coordinator.workers.netprobe import NetworkFloor
from specwire.wire.timing import CallRecord

EXCLUDED_KINDS = ("open",)


@dataclass(frozen=True)
class CallShares:
    """Network, protocol and compute time of one call, in ns, with its bytes."""

    wall_ns: float
    compute_ns: float
    network_ns: float
    protocol_ns: float
    bytes_sent: int
    bytes_received: int


def attribute_call(call: CallRecord, floor: NetworkFloor) -> CallShares:
    """Split one call's wall time."""
    network = floor.call_ns(call.bytes_sent, call.bytes_received)
    compute = float(call.server.compute_ns)
    return CallShares(
        wall_ns=float(call.wall_ns),
        compute_ns=compute,
        network_ns=network,
        protocol_ns=call.wall_ns - compute - network,
        bytes_sent=call.bytes_sent,
        bytes_received=call.bytes_received,
    )


@dataclass(frozen=True)
class Attribution:
    """Totals over many calls, and the same per draft token and per generated token."""

    calls: int
    draft_tokens: int
    generated_tokens: int
    wall_ms: float
    compute_ms: float
    network_ms: float
    protocol_ms: float
    bytes_sent: int
    bytes_received: int

    def per(self, what: str) -> dict[str, float]:
        """Shares divided by draft tokens (``"draft"``) or generated tokens (``"token"``)."""
        n = self.draft_tokens if what == "draft" else self.generated_tokens
        if not n:
            return {}
        return {
            "calls": self.calls / n,
            "bytes": (self.bytes_sent + self.bytes_received) / n,
            "network_ms": self.network_ms / n,
            "protocol_ms": self.protocol_ms / n,
            "compute_ms": self.compute_ms / n,
            "wall_ms": self.wall_ms / n,
        }

    def per_call(self) -> dict[str, float]:
        """Shares of the mean call."""
        if not self.calls:
            return {}
        return {
            "network_ms": self.network_ms / self.calls,
            "protocol_ms": self.protocol_ms / self.calls,
            "compute_ms": self.compute_ms / self.calls,
            "wall_ms": self.wall_ms / self.calls,
            "bytes": (self.bytes_sent + self.bytes_received) / self.calls,
        }

    def to_dict(self) -> dict:
        """Plain data for JSON, with the derived shares."""
        return {
            **asdict(self),
            "per_draft_token": self.per("draft"),
            "per_token": self.per("token"),
            "per_call": self.per_call(),
        }


def attribute(
    calls: Iterable[CallRecord], floor: NetworkFloor, draft_tokens: int, generated_tokens: int
) -> Attribution:
    """Attribute every drafting call (session openings excluded)."""
    shares = [attribute_call(c, floor) for c in calls if c.kind not in EXCLUDED_KINDS]
    return Attribution(
        calls=len(shares),
        draft_tokens=draft_tokens,
        generated_tokens=generated_tokens,
        wall_ms=sum(s.wall_ns for s in shares) / 1e6,
        compute_ms=sum(s.compute_ns for s in shares) / 1e6,
        network_ms=sum(s.network_ns for s in shares) / 1e6,
        protocol_ms=sum(s.protocol_ns for s in shares) / 1e6,
        bytes_sent=sum(s.bytes_sent for s in shares),
        bytes_received=sum(s.bytes_received for s in shares),
    )
