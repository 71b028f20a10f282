"""Graded fallback: shrink k one step, then stop drafting; probe back up when things recover.

Over each window of drafting rounds the policy measures the acceptance rate
and the speculative throughput the engine actually got, (1 + accepted) tokens
per (draft time + verify time) per round, the paper's section 5.1 model
TPS_eff = (1 + αk) / (T_target + k·T_draft + c) with every term measured,
and compares it with autoregressive throughput, 1 / T_target for one
single-token target pass (measured at the start and on every AR round).

* If acceptance is under ``min_acceptance``, or SD runs slower than AR, k
  drops one step (k → k − 1); if the next window fails too, drafting stops.
* After ``probe_after`` AR rounds it tries the reduced k again for a window;
  a good window steps up again, up to the k that was asked for.

Every transition is kept with its time and reason. Losslessness does not
depend on k, so the output is unchanged whatever the policy decides.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from coordinator.decoding.results import RoundRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FallbackSettings:
    """Thresholds of the graded fallback (all flags)."""

    window: int = 8
    min_acceptance: float = 0.3
    probe_after: int = 32


@dataclass(frozen=True)
class Transition:
    """A change of k: when (wall clock, and seconds into the generation), from what, to what, why."""

    wall_time: float
    after_s: float
    from_k: int
    to_k: int
    reason: str


@dataclass
class GradedFallback:
    """Chooses k for each round from the engine's own measurements."""

    k: int
    settings: FallbackSettings
    single_pass_s: float | None = None
    current: int = 0
    transitions: list[Transition] = field(default_factory=list)
    _window: list[RoundRecord] = field(default_factory=list)
    _ar_rounds: int = 0
    _start: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.current = self.k

    def levels(self) -> list[int]:
        """The ladder: the asked k, one step down, then AR."""
        return sorted({self.k, max(self.k - 1, 1), 0}, reverse=True)

    def k_now(self) -> int:
        """The k for the next round."""
        return self.current

    def record(self, r: RoundRecord) -> None:
        """Learn from one finished round; maybe change k."""
        if r.k == 0:
            self.single_pass_s = r.verify_ns / 1e9
            self._ar_rounds += 1
            if self.current == 0 and self._ar_rounds >= self.settings.probe_after:
                self._move(+1, f"probing after {self._ar_rounds} autoregressive rounds")
            return
        self._window.append(r)
        if len(self._window) < self.settings.window:
            return
        verdict = self._judge(self._window)
        self._window = []
        if verdict is not None:
            self._move(-1, verdict)
        elif self.current < self.k:
            self._move(+1, "window passed")

    def _judge(self, rounds: list[RoundRecord]) -> str | None:
        """Why this window failed, or None if it passed."""
        drafted = sum(r.drafted for r in rounds)
        accepted = sum(r.accepted for r in rounds)
        alpha = accepted / drafted if drafted else 0.0
        if alpha < self.settings.min_acceptance:
            return f"acceptance {alpha:.0%} < {self.settings.min_acceptance:.0%}"
        if self.single_pass_s:
            spent = sum(r.draft_ns + r.verify_ns for r in rounds) / 1e9
            sd_tps = sum(len(r.tokens) for r in rounds) / spent if spent else 0.0
            ar_tps = 1.0 / self.single_pass_s
            if sd_tps < ar_tps:
                return f"SD {sd_tps:.2f} tok/s < AR {ar_tps:.2f} tok/s"
        return None

    def _move(self, step: int, reason: str) -> None:
        ladder = self.levels()
        i = ladder.index(self.current) - step
        new = ladder[min(max(i, 0), len(ladder) - 1)]
        if new == self.current:
            return
        t = Transition(time.time(), time.perf_counter() - self._start, self.current, new, reason)
        self.transitions.append(t)
        log.info("k %d -> %d: %s", t.from_k, t.to_k, reason)
        self.current = new
        self._ar_rounds = 0
        self._window = []
