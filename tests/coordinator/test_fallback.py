"""Graded fallback: k shrinks one step, then drafting stops, and it probes back up; output stays lossless."""

from __future__ import annotations

import mlx.core as mx
import pytest

from coordinator.drafting.local import LocalDraftSource
from coordinator.engine import SpeculativeDecoder
from coordinator.fallback import FallbackSettings, GradedFallback
from coordinator.results import RoundRecord
from specwire.drafter import DraftBlock
from specwire.models import LoadedModel, load_model
from specwire.sampling import SamplingParams
from tests.support.prompts import ar_tokens

PROMPT = "Once upon a time, a lighthouse keeper"


def perturbed_draft(scale: float = 0.3) -> LoadedModel:
    """The default model with noise on its norm weights: the same vocabulary, worse drafts."""
    draft = load_model("default")
    mx.random.seed(0)
    for layer in draft.model.layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight = norm.weight * (1 + scale * mx.random.normal(norm.weight.shape))
    mx.eval(draft.model.parameters())
    return draft


def round_record(k: int, accepted: int, draft_ms: float = 10, verify_ms: float = 10) -> RoundRecord:
    block = DraftBlock(list(range(k)), None, k, 0)
    return RoundRecord(k, accepted, [0] * (accepted + 1), int(draft_ms * 1e6), int(verify_ms * 1e6), 0, block)


def test_low_acceptance_steps_down_then_stops_drafting_and_stays_lossless(default_q4: LoadedModel) -> None:
    draft = perturbed_draft()
    assert draft.fingerprint == default_q4.fingerprint
    settings = FallbackSettings(window=3, min_acceptance=0.5, probe_after=1000)
    decoder = SpeculativeDecoder(default_q4, LocalDraftSource(draft), settings)
    prompt = default_q4.tokenizer.encode(PROMPT)
    result = decoder.generate(prompt, max_tokens=24, k=4, params=SamplingParams())
    assert result.tokens == ar_tokens(default_q4, prompt, 24)
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
