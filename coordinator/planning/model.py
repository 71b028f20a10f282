"""The performance model: decode tok/s of speculative decoding from named inputs, each formula once.

A round drafts k tokens, the target verifies k + 1 positions in one pass,
and 1 + E[accepted] tokens come out. Its time on the target's critical
path, by how the drafts are made:

    local         verify(k + 1) + k * draft
    stream        verify(k + 1) + k * draft + rtt + protocol_round + bytes_round / bandwidth
    ggml-rpc      verify(k + 1) + k * (draft + calls_per_pass * (rtt + protocol_call)
                                      + bytes_per_pass / bandwidth)
    stream+prespec  as stream, but the k drafting passes are off the critical
                  path on a hit (made while the target verified), half of them
                  on a partial hit, and on a miss they are made on demand after
                  the pass in flight ends: half a pass on a miss on average,
                  or the wait a bench measured (the worker's receive-to-start)
    stream+prespec+fill  as stream, but the worker answers at once with the
                  drafts it has ready and the target's machine drafts the rest
                  (``fill_passes`` per round, at its own ``fill_draft_s``)

where verify(n) = verify_1 + (n - 1) * verify_per_position and
E[accepted | k] = sum over i = 1..k of prod over j <= i of alpha_j (a draft
counts only if every draft before it was accepted). AR makes one token per
verify(1).

This is the paper's model, TPS = (1 + alpha k) / (T_t + k T_d + c)
(seeds/000, section 5.1), with four departures: acceptance is a profile and
counts prefixes (alpha * k counts a draft after a rejection; with a measured
per-round mean, 1 + mean is used as is); verification may grow with k
(Metal: nearly flat; a CPU: about linear); the constant c is split into the
link and the protocol, per round or per call; and pre-speculation overlaps
drafting with verification.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

BACKENDS = ("local", "stream", "stream+prespec", "stream+prespec+fill", "ggml-rpc")


@dataclass(frozen=True)
class Target:
    """The target's verification pass: ``verify_1`` over one position, plus ``per_position`` each.

    ``engine_s`` is the engine's own time per round outside drafting and
    verifying (bookkeeping, sampling), which every round pays, AR included.
    """

    verify_1_s: float
    per_position_s: float = 0.0
    engine_s: float = 0.0

    def verify_s(self, positions: int) -> float:
        """One verification pass over ``positions`` positions."""
        return self.verify_1_s + (positions - 1) * self.per_position_s


@dataclass(frozen=True)
class Acceptance:
    """Per-position acceptance: ``profile[i]`` is P(draft i + 1 accepted | drafts before it accepted).

    A single value is a constant rate. ``mean_accepted`` (per round, at
    ``at_k``) overrides the profile at that k, as a bench measures it.
    """

    profile: tuple[float, ...] = (0.0,)
    mean_accepted: float | None = None
    at_k: int = 0

    def expected_accepted(self, k: int) -> float:
        """E[accepted drafts | k drafts]."""
        if self.mean_accepted is not None and k == self.at_k:
            return self.mean_accepted
        total, survive = 0.0, 1.0
        for i in range(k):
            survive *= self.profile[min(i, len(self.profile) - 1)]
            total += survive
        return total

    @classmethod
    def constant_for(cls, mean_accepted: float, k: int) -> Acceptance:
        """The constant rate alpha whose E[accepted | k] equals ``mean_accepted`` (bisection)."""
        return cls((_rate_for(mean_accepted, k),), mean_accepted, k)


@functools.lru_cache(maxsize=4096)
def _rate_for(mean_accepted: float, k: int) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if Acceptance((mid,)).expected_accepted(k) < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Link:
    """The network path: round-trip time of a small message, and bandwidth (bytes/s)."""

    rtt_s: float = 0.0
    bandwidth_Bps: float = float("inf")

    def carry_s(self, nbytes: float) -> float:
        """Serialisation time of ``nbytes`` at the link's bandwidth."""
        return nbytes / self.bandwidth_Bps


@dataclass(frozen=True)
class Transport:
    """One backend's costs beyond compute and the bare link.

    stream: ``per_round_s`` and ``bytes_per_round`` (both ways); ggml-rpc:
    ``per_call_s``, ``calls_per_pass`` (operations per call decide it: op,
    layer, token) or ``calls_per_round`` (granularity round) and
    ``bytes_per_pass``; stream+prespec also ``hit`` and ``partial`` (fractions
    of rounds).
    """

    backend: str
    per_round_s: float = 0.0
    bytes_per_round: float = 0.0
    per_call_s: float = 0.0
    calls_per_pass: float = 0.0
    calls_per_round: float = 0.0
    bytes_per_pass: float = 0.0
    hit: float = 0.0
    partial: float = 0.0
    in_flight_s: float | None = None  # wait for a speculative pass in flight, per round
    on_demand_passes: float | None = None  # draft passes after the verdict, per round (ahead.prespec)
    fill_passes: float = 0.0  # stream+prespec+fill: drafts per round made on the target's machine
    fill_draft_s: float = 0.0  # ... each taking this long there


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for one configuration at one k."""

    backend: str
    k: int
    round_s: float
    tokens_per_round: float
    tok_s: float
    parts_s: dict[str, float] = field(default_factory=dict)


def round_parts(target: Target, draft_s: float, k: int, link: Link, transport: Transport) -> dict[str, float]:
    """The critical-path parts of one round (seconds), by name."""
    parts = {"verify": target.verify_s(k + 1)}
    if target.engine_s:
        parts["engine"] = target.engine_s
    b = transport.backend
    if b == "local":
        parts["draft"] = k * draft_s
    elif b == "stream+prespec+fill":
        parts["link"] = link.rtt_s + link.carry_s(transport.bytes_per_round)
        parts["protocol"] = transport.per_round_s
        parts["draft"] = transport.fill_passes * transport.fill_draft_s
        if transport.in_flight_s:
            parts["in flight"] = transport.in_flight_s
    elif b in ("stream", "stream+prespec"):
        parts["link"] = link.rtt_s + link.carry_s(transport.bytes_per_round)
        parts["protocol"] = transport.per_round_s
        on_demand = 1.0 if b == "stream" else (1 - transport.hit - transport.partial) + transport.partial / 2
        passes = on_demand * k if transport.on_demand_passes is None else transport.on_demand_passes
        parts["draft"] = passes * draft_s
        if b == "stream+prespec":  # the worker may be mid-way through a speculative pass: wait for it
            in_flight = transport.in_flight_s
            parts["in flight"] = (
                (1 - transport.hit - transport.partial) * draft_s / 2 if in_flight is None else in_flight
            )
    elif b == "ggml-rpc":
        calls = k * transport.calls_per_pass + transport.calls_per_round
        parts["draft"] = k * draft_s
        parts["link"] = calls * link.rtt_s + link.carry_s(k * transport.bytes_per_pass)
        parts["protocol"] = calls * transport.per_call_s
    else:
        raise ValueError(f"unknown backend {b!r}; expected one of {', '.join(BACKENDS)}")
    return parts


def predict(
    target: Target, draft_s: float, acceptance: Acceptance, k: int, link: Link, transport: Transport
) -> Prediction:
    """Decode tok/s of one configuration at ``k`` drafts per round."""
    parts = round_parts(target, draft_s, k, link, transport)
    round_s = sum(parts.values())
    tokens = 1 + acceptance.expected_accepted(k)
    return Prediction(transport.backend, k, round_s, tokens, tokens / round_s, parts)


def ar_tok_s(target: Target) -> float:
    """Autoregressive decode tok/s: one token per single-position pass."""
    return 1 / (target.verify_s(1) + target.engine_s)


def best_k(
    target: Target,
    draft_s: float,
    acceptance: Acceptance,
    link: Link,
    transport: Transport,
    ks: range = range(1, 17),
) -> Prediction:
    """The k with the highest predicted tok/s."""
    return max((predict(target, draft_s, acceptance, k, link, transport) for k in ks), key=lambda p: p.tok_s)
