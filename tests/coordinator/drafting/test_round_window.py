"""``RoundWindow``'s running sums read as the window's rounds summed afresh would."""

from __future__ import annotations

import random

from coordinator.drafting.auto.window import RoundWindow


def test_running_sums_match_the_rounds_summed_afresh_through_evictions_and_a_clear() -> None:
    rng = random.Random(7)
    window, held = RoundWindow(4), []
    end = 0
    for n in range(40):
        if n == 23:  # a move: the new set-up starts from nothing
            window.clear()
            held = []
        end += rng.randint(5_000_000, 40_000_000)
        round_ = (rng.randint(1, 4), end, rng.randint(0, 4_000_000))
        window.append(*round_)
        held = [*held, round_][-5:]
        measured = held[1:]
        elapsed = held[-1][1] - held[0][1]
        full = len(held) == 5
        assert window.full == full
        assert window.tok_s() == (sum(t for t, _, _ in measured) / (elapsed / 1e9) if full else None)
        waited = min(1.0, sum(d for _, _, d in measured) / elapsed) if full else 0.0
        assert abs(window.waited_share() - waited) < 1e-12
        per_round = sum(t for t, _, _ in measured) / len(measured) if measured else 1.0
        assert window.tokens_per_round() == per_round
