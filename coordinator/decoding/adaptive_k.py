"""Adaptive k: each round's k from the paper's TPS model, extended for drafting that overlaps verification.

The paper (section 5.1) models speculative throughput as tokens per round
over time per round. With a per-draft acceptance rate alpha, a round of k
drafts yields E(k) = (1 - alpha^(k+1)) / (1 - alpha) tokens. Its time is
the target's verify pass over k + 1 positions plus the wait for the drafts:

    T(k) = T_verify(k) + c + (1 - h) * k * t_draft

where c is what a round costs beyond draft compute (the round trip, for a
remote worker), t_draft the draft compute per token, and h the share of
rounds a pre-speculating worker serves from a branch drafted ahead (their
drafting overlapped the previous verify pass, so it is off the critical
path; h = 0 without pre-speculation). The policy picks the k in 1..k_max
that maximises E(k) / T(k), every term measured by the engine itself:

* alpha: accepted over (accepted + rejections), the geometric model's
  estimate, from a prior of 0.8;
* T_verify(k): the target's passes over 1 and k_max + 1 positions, timed
  once at the start, then each k's own mean as rounds run;
* c, t_draft, h: moving averages over recent rounds (worker compute from
  its replies, the rest from the engine's wait).

k never affects the output, only the speed, so the policy is free to explore.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.decoding.results import RoundRecord

PRIOR_ACCEPTED = 4.0
PRIOR_REJECTIONS = 1.0
SMOOTHING = 0.2  # weight of the newest round in the moving averages


@dataclass
class AdaptiveK:
    """Chooses k each round to maximise modelled tokens per second (see the module docstring)."""

    k_max: int
    verify_prior_s: tuple[float, float]  # one target pass over 1 and over k_max + 1 positions
    accepted: float = PRIOR_ACCEPTED
    rejections: float = PRIOR_REJECTIONS
    draft_token_s: float | None = None
    overhead_s: float | None = None
    hit_rate: float = 0.0
    rounds: int = 0
    chosen: list[int] = field(default_factory=list)
    transitions: list = field(default_factory=list)  # the engine's interface; k changes are in ``chosen``
    _verify_s: dict[int, float] = field(default_factory=dict)

    @property
    def alpha(self) -> float:
        """Estimated per-draft acceptance rate."""
        return self.accepted / (self.accepted + self.rejections)

    def verify_s(self, k: int) -> float:
        """Modelled verify time for k drafts: measured for this k, else the start-up line, rescaled."""
        if k in self._verify_s:
            return self._verify_s[k]
        one, full = self.verify_prior_s
        prior = one + (full - one) * k / self.k_max
        seen = [(abs(j - k), j) for j in self._verify_s]
        if not seen:
            return prior
        _, j = min(seen)
        return prior * self._verify_s[j] / (one + (full - one) * j / self.k_max)

    def expected_tps(self, k: int) -> float:
        """Modelled tokens per second at ``k``."""
        a = min(self.alpha, 0.999)
        tokens = (1 - a ** (k + 1)) / (1 - a)
        draft = self.draft_token_s if self.draft_token_s is not None else 0.0
        seconds = self.verify_s(k) + (self.overhead_s or 0.0) + (1 - self.hit_rate) * k * draft
        return tokens / seconds

    def k_now(self) -> int:
        """The k for the next round."""
        # Until a round is measured, start at the maximum.
        ks = range(1, self.k_max + 1)
        k = self.k_max if self.draft_token_s is None else max(ks, key=self.expected_tps)
        self.chosen.append(k)
        return k

    def record(self, r: RoundRecord) -> None:
        """Learn from one finished round."""
        if r.k == 0 or not r.drafted:
            return
        self.rounds += 1
        self.accepted += r.accepted
        self.rejections += r.accepted < r.drafted
        self._verify_s[r.k] = _mix(self._verify_s.get(r.k), r.verify_ns / 1e9)
        if self.rounds == 1:  # round 0's wait overlaps the target's prefill: not a round's cost
            return
        speculation = r.draft.speculation
        if speculation:
            self.hit_rate = _mix(self.hit_rate, 1.0 if speculation == "hit" else 0.0)
        if speculation != "hit" and r.draft.compute_ns > 0:
            self.draft_token_s = _mix(self.draft_token_s, r.draft.compute_ns / 1e9 / r.drafted)
        self.overhead_s = _mix(self.overhead_s, max(0.0, (r.draft_ns - r.draft.compute_ns) / 1e9))


def _mix(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
