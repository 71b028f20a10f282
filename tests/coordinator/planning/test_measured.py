"""The measured pair's acceptance at a temperature (``Agreement.at``)."""

from __future__ import annotations

import numpy as np

from coordinator.planning.measured import Agreement
from specwire.drafting.sampling import SamplingParams, draft_distribution, target_distribution


def test_a_target_speaking_fewer_ids_than_its_draft_accepts_none_of_the_others() -> None:
    # ``tiny`` speaks the first 2,048 ids of its tokenizer's 49,152; the default draft speaks them all.
    # `coordinator serve --target tiny` failed here (IndexError) before it printed its drafting plan.
    rng = np.random.default_rng(0)
    target, draft = rng.normal(size=(5, 16)), rng.normal(size=(5, 32))
    draft[:, 16:] += 3.0  # most of the draft's mass where the target has none
    alpha, within = Agreement(0.0, 0.0, 0.0, target, draft).at(1.0)
    params = SamplingParams(temperature=1.0)
    expected = []
    for t_row, d_row in zip(target, draft, strict=True):
        p, q = target_distribution(t_row, params), draft_distribution(d_row, params)
        expected.append(sum(min(p[i], w) for i, w in zip(q.ids, q.probs, strict=True) if i < p.size))
    assert np.isclose(alpha, np.mean(expected))
    assert 0 < alpha < 0.5
    assert all(0 <= v <= 1 for v in within.values())
