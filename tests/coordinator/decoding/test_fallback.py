"""Graded fallback: k shrinks one step, then drafting stops, and it probes back up; output stays lossless."""

from __future__ import annotations

import pytest

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.decoding.fallback import FallbackSettings, GradedFallback
from coordinator.decoding.results import RoundRecord
from coordinator.drafting.local import LocalDraftSource
from specwire.drafter import DraftBlock
from specwire.sampling import SamplingParams
from tests.support.prompts import ar_tokens
from tests.support.tiny_models import disagreeing_pair

PROMPT = [2, 5, 1]


def round_record(k: int, accepted: int, draft_ms: float = 10, verify_ms: float = 10) -> RoundRecord:
    block = DraftBlock(list(range(k)), None, k, 0)
    return RoundRecord(k, accepted, [0] * (accepted + 1), int(draft_ms * 1e6), int(verify_ms * 1e6), 0, block)


def test_low_acceptance_steps_down_then_stops_drafting_and_stays_lossless() -> None:
    target, draft = disagreeing_pair()  # a draft that is mostly rejected
    settings = FallbackSettings(window=3, min_acceptance=0.5, probe_after=1000)
    decoder = SpeculativeDecoder(target, LocalDraftSource(draft), settings)
    result = decoder.generate(PROMPT, max_tokens=48, k=4, params=SamplingParams())
    assert result.tokens == ar_tokens(target, PROMPT, 48)
    steps = [(t.from_k, t.to_k) for t in result.transitions]
    assert steps[:2] == [(4, 3), (3, 0)]
    assert all("acceptance" in t.reason for t in result.transitions[:2])
    assert all(t.after_s >= 0 and t.wall_time > 0 for t in result.transitions)
    ks = [r.k for r in result.rounds]
    assert ks == sorted(ks, reverse=True) and {4, 3, 0} <= set(ks)  # no probing within 1,000 rounds


def test_probes_back_up_after_autoregressive_rounds() -> None:
    policy = GradedFallback(
        4, FallbackSettings(window=2, min_acceptance=0.5, probe_after=3), single_pass_s=None
    )
    for _ in range(2):
        policy.record(round_record(4, 0))
    assert policy.k_now() == 3
    for _ in range(2):
        policy.record(round_record(3, 0))
    assert policy.k_now() == 0
    for _ in range(3):
        policy.record(round_record(0, 0))
    assert policy.k_now() == 3  # probing
    for _ in range(2):
        policy.record(round_record(3, 3))
    assert policy.k_now() == 4  # recovered
    assert [(t.from_k, t.to_k) for t in policy.transitions] == [(4, 3), (3, 0), (0, 3), (3, 4)]


@pytest.mark.parametrize(("verify_ms", "steps_down"), [(10.0, False), (100.0, True)])
def test_steps_down_when_drafting_costs_more_than_it_saves(verify_ms: float, steps_down: bool) -> None:
    # Two tokens per round at 10 ms of drafting: SD gives 2 / (10 ms + verify); AR one token per 20 ms.
    policy = GradedFallback(
        4, FallbackSettings(window=2, min_acceptance=0.1, probe_after=10), single_pass_s=0.020
    )
    for _ in range(2):
        policy.record(round_record(4, 1, draft_ms=10, verify_ms=verify_ms))
    assert (policy.k_now() == 3) == steps_down
    if steps_down:
        assert "tok/s < AR" in policy.transitions[0].reason
