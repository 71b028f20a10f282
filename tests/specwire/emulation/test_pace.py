"""Paced compute: a pass is held to its profile's time, overruns are counted, and drafts do not change."""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from coordinator.decoding.rollback import Rollback
from specwire.drafting.drafter import Drafter, prefill
from specwire.drafting.sampling import SamplingParams
from specwire.drafting.token_tree import TokenTree
from specwire.emulation.pace import Pacer, headroom_quantile, pace_model, parse_pace
from specwire.emulation.profile import PassCurve
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel, load_model

PACED_MS = 12.0  # far above the tiny model's real pass, so none overruns even on a loaded machine


def pass_times_ms(model: LoadedModel, passes: int, positions: int = 1) -> np.ndarray:
    cache = make_prompt_cache(model.model)
    times = []
    for _ in range(passes):
        started = time.perf_counter()
        model.model(mx.array([[1] * positions]), cache=cache)
        times.append((time.perf_counter() - started) * 1e3)
    return np.array(times)


@pytest.mark.serial
def test_a_paced_pass_takes_its_profile_s_time(tiny: LoadedModel) -> None:
    pacer = Pacer(PassCurve(decode_tok_s=1e3 / PACED_MS, prefill_tok_s=1e3 / PACED_MS * 5), "test")
    paced = pace_model(tiny, pacer)
    single = pass_times_ms(paced, 9)
    assert single.min() >= PACED_MS  # never shorter than the profile says
    # The median is robust to a pass slowed by another process (a held pass can only end late).
    assert np.median(single) == pytest.approx(PACED_MS, abs=max(0.5, 0.05 * PACED_MS))
    wide = pass_times_ms(paced, 3, positions=10)  # compute-bound: 10 positions at 5 x the decode rate
    assert np.median(wide) == pytest.approx(2 * PACED_MS, abs=max(0.5, 0.05 * 2 * PACED_MS))
    # A loaded machine may preempt one pass past its 12 ms (seen once: 10.8 ms over, one busy core beside)
    assert pacer.counts.passes == 12 and pacer.counts.overruns <= 1


def test_a_pace_faster_than_the_real_compute_counts_every_pass_as_an_overrun(tiny: LoadedModel) -> None:
    pacer = Pacer(PassCurve(decode_tok_s=1e9), "too fast")  # a nanosecond a pass
    pass_times_ms(pace_model(tiny, pacer), 5)
    assert pacer.counts.passes == pacer.counts.overruns == 5
    assert pacer.counts.worst_overrun_s > 0


def test_headroom_counts_each_pass_by_its_real_share_of_the_paced_time() -> None:
    pacer = Pacer(PassCurve(decode_tok_s=100.0), "test")  # 10 ms a pass
    for real_ms in (1.0, 3.1, 3.3, 5.0, 25.0):
        pacer.record(real_ms / 1e3, 0.010, real_ms > 10)
    counts = pacer.snapshot()
    assert counts.headroom[5] == 1 and counts.headroom[15] == 1 and counts.headroom[16] == 1
    assert counts.headroom[25] == 1 and counts.headroom[-1] == 1 and len(counts.headroom) == 100
    assert headroom_quantile(counts.headroom, 0.5) == pytest.approx(0.34)  # the bucket's upper edge
    assert headroom_quantile(counts.headroom, 0.99) == pytest.approx(2.0)  # 2.5 lands in the last
    later = pacer.snapshot()
    pacer.record(0.001, 0.010, False)
    assert pacer.snapshot().since(later).headroom == [0] * 5 + [1]
    assert headroom_quantile([], 0.5) is None


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "seed": 3}])
def test_paced_drafts_are_the_unpaced_drafts(tiny: LoadedModel, sampling: dict) -> None:
    params = SamplingParams(**sampling)
    pacer = Pacer(PassCurve(decode_tok_s=1e3), "test")

    def drafts(model: LoadedModel) -> list[int]:
        drafter = Drafter(model.model, params)
        drafter.start([5, 6, 7, 8])
        first = drafter.draft(3).tokens
        drafter.apply(1, 9)
        return first + drafter.draft(3).tokens

    assert drafts(pace_model(tiny, pacer)) == drafts(tiny)
    assert pacer.counts.passes > 0


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("paper", "expected PROFILE:MACHINE"),
        ("paper:m3-max", "has no machine 'm3-max'; it has m2-ultra, m1-max, m2-pro"),
        ("/nonexistent.json:m1-max", "cannot read the profile"),
    ],
)
def test_a_bad_pace_is_refused_by_name(text: str, words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        parse_pace(text)


def test_a_drafting_machine_cannot_pace_a_target() -> None:
    with pytest.raises(InvalidArgumentError, match="M1 Max is a drafting machine"):
        parse_pace("paper:m1-max").target_curve()


def test_a_hybrid_targets_passes_that_keep_states_are_paced_like_its_calls() -> None:
    # Qwen3.5's verification runs over the model's modules (per-position and per-node states), not its call.
    hybrid = load_model("tiny-hybrid")
    pacer = Pacer(PassCurve(decode_tok_s=1e3 / PACED_MS), "hybrid")
    paced = pace_model(hybrid, pacer)
    cache = make_prompt_cache(hybrid.model)
    rollback = Rollback(paced.model, cache, 3)
    prefill(paced.model, cache, [5, 6, 7])
    before = pacer.snapshot()
    started = time.perf_counter()
    rollback.verify([8, 9, 10])  # a chain: states after every position
    rollback.keep_first(2)
    rollback.verify_tree(11, TokenTree((12, 13, 14), (-1, -1, 0)))  # a tree: states after every node
    rollback.keep_path([0])
    assert time.perf_counter() - started >= 2 * PACED_MS / 1e3  # a lower bound holds under any load
    assert pacer.snapshot().since(before).passes == 2
