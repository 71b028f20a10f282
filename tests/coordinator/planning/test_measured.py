"""The measured pair's acceptance at a temperature (``Agreement.at``), and pass curves fitted to measured
passes (``fit_curve``)."""

from __future__ import annotations

import numpy as np

from coordinator.planning.measured import Agreement, fit_curve
from specwire.drafting.sampling import SamplingParams, draft_distribution, target_distribution
from specwire.emulation.paper import load_profile


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


def test_a_macs_passes_fit_flat_and_then_rising_and_a_cpus_as_a_line() -> None:
    # A paced M1 Max's Hello: 11.55 ms up to 35 rows, then its prefill rate. A line through those points
    # sloped from the first row (its 16-row pass read 14.0 ms); the fit must give every point back.
    sizes = (1, 2, 4, 8, 16, 32, 64)
    mac = load_profile("paper").machine("m1-max").draft
    assert mac is not None
    fitted = fit_curve([(n, mac.pass_s(n)) for n in sizes])
    for n in (*sizes, 35, 48):
        assert np.isclose(fitted.pass_s(n), mac.pass_s(n), rtol=1e-6), n
    # A CPU's passes cost every row: the line through them, anchored at one row.
    cpu = fit_curve([(n, 2e-3 + 1e-4 * (n - 1)) for n in sizes])
    assert (cpu.prefill_tok_s, cpu.decode_tok_s) == (None, 500.0)
    assert np.isclose(cpu.per_position_s, 1e-4)
    flat = fit_curve([(n, 0.01) for n in sizes])  # nothing rises: flat as far as measured
    assert flat.pass_s(64) == 0.01
