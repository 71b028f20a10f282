"""The planner's batch: B requests decoded together, by the profile's pass over B sequences."""

from __future__ import annotations

import dataclasses

import pytest

from coordinator.planning import profile as planned
from coordinator.planning.concurrent import batched, worker_round_s
from coordinator.planning.model import Transport, best_k
from specwire.emulation.paper import load_profile
from specwire.emulation.profile import PassCurve


def test_one_request_in_a_batch_is_local_sd_at_its_best_k() -> None:
    profile = load_profile("paper")
    assert profile.local_draft is not None
    alone = best_k(
        planned.target(profile),
        1 / profile.local_draft.decode_tok_s,
        planned.acceptance(profile),
        planned.link(profile),
        Transport("local"),
    )
    one = batched(profile, 1)
    assert (one.k, one.tok_s) == (alone.k, pytest.approx(alone.tok_s))


def test_requests_share_a_round_while_passes_are_flat_and_pay_once_the_prompt_rate_binds() -> None:
    profile = load_profile("paper")
    one, four = batched(profile, 1), batched(profile, 4)
    assert four.round_s == pytest.approx(one.round_s) and four.tok_s == pytest.approx(4 * one.tok_s)
    # A target whose pass grows with every position: four requests no longer cost one's round.
    curve = PassCurve(profile.target.decode_tok_s, None, 0.004)
    steep = dataclasses.replace(
        profile, target_machine=dataclasses.replace(profile.target_machine, target=curve)
    )
    assert batched(steep, 4).round_s > batched(steep, 1).round_s
    assert batched(steep, 4).tok_s < 4 * batched(steep, 1).tok_s


def test_a_worker_drafting_for_the_batch_makes_its_round_longer_than_the_local_batch() -> None:
    profile = load_profile("paper")
    four = batched(profile, 4)
    for machine in profile.workers:
        assert worker_round_s(profile, machine, 4, four.k) > four.round_s
