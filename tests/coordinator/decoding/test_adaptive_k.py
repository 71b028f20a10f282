"""Adaptive k: the TPS model picks long rounds when drafts are accepted and cheap, short ones otherwise."""

from __future__ import annotations

from coordinator.decoding.adaptive_k import AdaptiveK
from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.decoding.results import RoundRecord
from coordinator.drafting.local import LocalDraftSource
from specwire.drafter import DraftBlock
from specwire.sampling import SamplingParams
from tests.support.prompts import ar_tokens
from tests.support.tiny_models import disagreeing_pair

PROMPT = [2, 5, 1]
VERIFY = (0.100, 0.140)  # a target pass over 1 and over k_max + 1 = 9 positions (GPU-like: nearly flat)


def measured_round(
    k: int, accepted: int, compute_ms: float, wait_ms: float, speculation: str = ""
) -> RoundRecord:
    """A round as the engine records it: k drafts, the worker's compute, and the engine's wait."""
    block = DraftBlock(list(range(k)), None, k, int(compute_ms * 1e6), speculation=speculation)
    verify_ns = int((VERIFY[0] + (VERIFY[1] - VERIFY[0]) * k / 8) * 1e9)
    return RoundRecord(k, accepted, [0] * (accepted + 1), int(wait_ms * 1e6), verify_ns, 0, block)


def run_policy(
    policy: AdaptiveK, rounds: int, accepted: int | None, draft_ms: float, speculation: str = ""
) -> int:
    for _ in range(rounds):
        k = policy.k_now()
        compute = 0.0 if speculation == "hit" else draft_ms * k
        policy.record(
            measured_round(
                k, k if accepted is None else min(k, accepted), compute, compute + 2.0, speculation
            )
        )
    return policy.k_now()


def test_high_acceptance_and_cheap_drafts_choose_long_rounds() -> None:
    assert run_policy(AdaptiveK(8, VERIFY), 20, accepted=None, draft_ms=5) == 8


def test_rejections_choose_short_rounds() -> None:
    assert run_policy(AdaptiveK(8, VERIFY), 20, accepted=0, draft_ms=5) == 1


def test_drafting_that_overlaps_verification_allows_longer_rounds() -> None:
    # Expensive drafts: on demand they cap k; served ahead (hits) they cost nothing on the critical path.
    # Three drafts accepted per round: long rounds only pay when drafting is off the critical path.
    on_demand = run_policy(AdaptiveK(8, VERIFY), 30, accepted=3, draft_ms=60)
    ahead = AdaptiveK(8, VERIFY)
    run_policy(ahead, 2, accepted=3, draft_ms=60)  # learn the draft cost first
    assert run_policy(ahead, 30, accepted=3, draft_ms=60, speculation="hit") > on_demand


def test_adaptive_k_stays_lossless_with_a_draft_often_rejected() -> None:
    target, draft = disagreeing_pair()
    decoder = SpeculativeDecoder(target, LocalDraftSource(draft), adaptive_k=True)
    result = decoder.generate(PROMPT, max_tokens=48, k=6, params=SamplingParams())
    assert result.tokens == ar_tokens(target, PROMPT, 48)
    ks = [r.k for r in result.rounds[:-1]]
    assert ks[0] == 6 and all(1 <= k <= 6 for k in ks) and len(set(ks)) > 1
