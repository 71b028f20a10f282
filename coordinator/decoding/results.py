"""What a generation produced and measured: one record per round, and the whole result.

Times are ``perf_counter_ns`` on the coordinator. The engine writes these;
the generate command, the bench and the drafting policy read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coordinator.decoding.rollback import RollbackStats
from specwire.drafting.drafter import DraftBlock


@dataclass
class RoundRecord:
    """What one round did and cost; times are ``perf_counter_ns`` on this machine."""

    k: int
    accepted: int
    tokens: list[int]
    draft_ns: int
    verify_ns: int
    end_ns: int
    draft: DraftBlock
    rollback_ns: int = 0  # rolling the target's cache back after rejected drafts (in verify_ns)

    @property
    def drafted(self) -> int:
        """Drafts proposed this round."""
        return len(self.draft.tokens)


@dataclass
class GenerationResult:
    """The tokens one generation produced, and everything measured on the way."""

    prompt_tokens: int
    tokens: list[int]
    finish_reason: str
    start_ns: int
    prefill_end_ns: int
    end_ns: int
    token_ns: list[int] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    transitions: list[Any] = field(default_factory=list)  # coordinator.drafting.auto.report.Switch
    rollback: RollbackStats | None = None
    cached_tokens: int = 0  # prompt positions the target took from the prompt cache
    cache_note: str = ""  # why a prompt that shares a cached prefix could not reuse it

    @property
    def ttft_s(self) -> float:
        """Seconds from the start (prefill included) to the first token."""
        return (self.token_ns[0] - self.start_ns) / 1e9 if self.token_ns else float("nan")

    @property
    def decode_tps(self) -> float:
        """Generated tokens per second of decoding (after prefill)."""
        elapsed = (self.end_ns - self.prefill_end_ns) / 1e9
        return len(self.tokens) / elapsed if elapsed > 0 else float("nan")

    @property
    def drafted(self) -> int:
        """Draft tokens proposed over the whole generation."""
        return sum(r.drafted for r in self.rounds)

    @property
    def accepted(self) -> int:
        """Draft tokens the target accepted over the whole generation."""
        return sum(r.accepted for r in self.rounds)

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over proposed drafts (NaN without drafts)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def mean_accepted(self) -> float:
        """Mean drafts accepted per round that drafted."""
        drafting = [r for r in self.rounds if r.drafted]
        return sum(r.accepted for r in drafting) / len(drafting) if drafting else float("nan")

    def inter_token_s(self) -> np.ndarray:
        """Gaps between consecutive emitted tokens, in seconds (bursts show as zeros)."""
        return np.diff(np.asarray(self.token_ns, dtype=np.int64)) / 1e9
