"""Concurrent requests decoded together (``serve``'s batch): what B requests make, by the profile.

A batch round drafts k tokens for each of B requests in k passes over B
sequences on the target's machine, then verifies all of them in one pass
over B sequences of k + 1 positions (``coordinator.decoding.batch``). The
profile prices a pass over B sequences as one over B times its positions
(``PassCurve.pass_s``), flat until the prompt rate binds, so

    round(B, k) = target.pass_s(k + 1, B) + k * draft.pass_s(1, B)
    aggregate   = B * (1 + E[accepted | k]) / round(B, k)

each request taking the k that makes the batch fastest. A worker does not
draft for a batch: its chain would take k passes of its own plus a round
trip while the target's machine waits, where the local batch pass costs
the target's machine about one pass for every request (``worker_round_s``
says how long, for the comparison).
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.planning import profile as planned
from specwire.emulation.profile import Machine, PassCurve, Profile

ROWS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Batched:
    """The batch of ``rows`` requests at its best k: its round, and the tokens a second it makes."""

    rows: int
    k: int
    round_s: float
    tok_s: float  # every request together

    @property
    def per_request_tok_s(self) -> float:
        return self.tok_s / self.rows


def batched(profile: Profile, rows: int, ks: range = range(1, 17)) -> Batched:
    """``rows`` requests decoded together with the target machine's draft model, at the best k."""
    draft = profile.local_draft
    if draft is None:
        raise ValueError(f"profile {profile.name} gives no draft speed on the target's machine")
    acceptance = planned.acceptance(profile)

    def at(k: int) -> Batched:
        round_s = profile.target.pass_s(k + 1, rows) + k * draft.pass_s(1, rows)
        return Batched(rows, k, round_s, rows * (1 + acceptance.expected_accepted(k)) / round_s)

    return max((at(k) for k in ks), key=lambda b: b.tok_s)


def worker_round_s(profile: Profile, machine: Machine, rows: int, k: int) -> float:
    """A batch round whose chains a worker drafts (k passes over ``rows`` sequences there, one stream
    round trip), then the target verifies: what a worker would cost a batch, for comparison."""
    curve: PassCurve | None = machine.draft
    if curve is None:
        raise ValueError(f"{machine.name} has no draft speed")
    link, stream = planned.link(profile), planned.stream(profile)
    trip = link.rtt_s + link.carry_s(stream.bytes_per_round * rows) + stream.per_round_s
    return profile.target.pass_s(k + 1, rows) + k * curve.pass_s(1, rows) + trip
