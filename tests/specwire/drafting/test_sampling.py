"""Target and draft distributions."""

from __future__ import annotations

import numpy as np
import pytest

from specwire.drafting.sampling import (
    SamplingParams,
    choose_draft_token,
    draft_distribution,
    sample_dense,
    softmax,
    target_distribution,
)
from specwire.errors import InvalidArgumentError

LOGITS = np.log(np.array([0.05, 0.5, 0.3, 0.15]))


def test_plain_temperature_is_softmax() -> None:
    p = target_distribution(LOGITS, SamplingParams(temperature=1.0))
    np.testing.assert_allclose(p, [0.05, 0.5, 0.3, 0.15])
    hot = target_distribution(LOGITS, SamplingParams(temperature=2.0))
    assert hot[1] < 0.5 and hot[0] > 0.05


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.45, {1}), (0.55, {1, 2}), (0.79, {1, 2}), (0.85, {1, 2, 3}), (1.0, {0, 1, 2, 3})],
)
def test_top_p_keeps_smallest_prefix_reaching_p(top_p: float, kept: set[int]) -> None:
    p = target_distribution(LOGITS, SamplingParams(temperature=1.0, top_p=top_p))
    assert set(np.flatnonzero(p)) == kept
    assert p.sum() == pytest.approx(1.0)


def test_top_k_keeps_k_most_likely() -> None:
    p = target_distribution(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert set(np.flatnonzero(p)) == {1, 2}
    assert p[1] == pytest.approx(0.5 / 0.8)


def test_draft_distribution_is_sparse_sorted_and_normalised() -> None:
    q = draft_distribution(LOGITS, SamplingParams(temperature=1.0, draft_top_k=3))
    assert list(q.ids) == [1, 2, 3]
    assert q.probs.sum() == pytest.approx(1.0)
    assert q.prob(1) == pytest.approx(0.5 / 0.95)
    assert q.prob(0) == 0.0
    np.testing.assert_allclose(q.dense(4), [0, 0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95])


def test_draft_distribution_respects_user_top_k() -> None:
    q = draft_distribution(LOGITS, SamplingParams(temperature=1.0, top_k=1, draft_top_k=3))
    assert list(q.ids) == [1]


def test_sample_dense_frequencies() -> None:
    rng = np.random.default_rng(0)
    probs = np.array([0.1, 0.0, 0.6, 0.3])
    counts = np.bincount([sample_dense(probs, rng) for _ in range(20000)], minlength=4)
    assert counts[1] == 0
    np.testing.assert_allclose(counts / counts.sum(), probs, atol=0.015)


def test_greedy_draft_choice_is_argmax_without_distribution() -> None:
    token, dist = choose_draft_token(LOGITS, SamplingParams(), np.random.default_rng(0))
    assert (token, dist) == (1, None)


def test_same_seed_same_draws() -> None:
    params = SamplingParams(temperature=1.0)

    def draws(seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        return [choose_draft_token(LOGITS, params, rng)[0] for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_softmax_is_stable_for_large_logits() -> None:
    assert softmax(np.array([1000.0, 1000.0]), 1.0) == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"draft_top_k": 0}],
)
def test_bad_parameters_are_refused(kwargs: dict) -> None:
    with pytest.raises(InvalidArgumentError):
        SamplingParams(**kwargs)
