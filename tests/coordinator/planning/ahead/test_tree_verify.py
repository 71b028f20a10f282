"""Tree verification, predicted (``coordinator/planning/ahead/tree_verify.py``), at its limits."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coordinator.planning import profile as planned
from coordinator.planning.ahead.tree_verify import (
    WORKER_SETTLE_S,
    best_size,
    curve_tree_rows,
    local_tree,
    miss_round_s,
    miss_shape,
    remote_tree,
    tree_rows,
)
from coordinator.planning.setups import TREE_ROUNDS, Setup, predict_setup
from specwire.emulation.paper import load_profile
from specwire.emulation.profile import Machine, PassCurve, Profile

ROUNDS = 1500


def with_verify_per_position(profile: Profile, seconds: float) -> Profile:
    """``profile`` with each verified position costing ``seconds`` more (a less flat curve)."""
    curve = replace(profile.target, per_position_s=seconds)
    return replace(profile, target_machine=replace(profile.target_machine, target=curve))


def test_the_size_that_pays_is_every_node_where_positions_are_free_and_one_where_each_costs_a_pass() -> None:
    chances = [0.6, 0.3, 0.2, 0.1, 0.05]
    assert best_size(chances, lambda n: 0.02) == len(chances)
    assert best_size(chances, lambda n: 0.02 * n) == 1


def test_local_tree_sd_grows_where_verification_is_flat_and_shrinks_to_a_chain_where_it_is_not() -> None:
    paper = load_profile("paper")
    flat = local_tree(paper, 8)
    assert flat.nodes == 16  # the whole tree: the M2 Ultra verifies 17 positions at the cost of one
    steep = with_verify_per_position(paper, 0.004)
    small = local_tree(steep, 8)
    assert small.nodes <= 3
    best_chain = max(predict_setup(steep, Setup("local", k)) for k in range(1, 9))
    assert small.tok_s == pytest.approx(best_chain, rel=0.1)  # a chain's size, a chain's speed
    assert flat.tok_s > max(predict_setup(paper, Setup("local", k)) for k in range(1, 9))


def test_a_miss_verifies_the_lone_token_only_where_the_round_holds_two_passes_after_one_in_flight() -> None:
    """The paper's M1 Max (11.55 ms passes, a 26.65 ms round) had 2.4 ms to spare for two passes, and on
    the test bed on 2026-11-29 its lone-token misses made 49.8-56 tok/s against a local tree's 61.7 on
    the same commit: the verdict comes in the middle of a pass. On the 27B (a 55.24 ms round) four fit."""
    assert miss_shape(11.55e-3, 26.65e-3) == "tree"  # paper: 2 passes fit, 2.5 do not
    assert miss_shape(11.55e-3, 55.24e-3) == "ar"  # m2-ultra-27b
    assert miss_shape(15.90e-3, 55.24e-3) == "ar"  # the M2 Pro there
    assert miss_shape(11.55e-3, 30.08e-3) == "ar" and miss_shape(11.55e-3, 30.0e-3) == "tree"


def test_the_planner_decides_a_miss_as_the_coordinator_does_with_the_links_time_left_out() -> None:
    """A worker whose two and a half passes fit a lone-token round only with the link's round trip
    counted: the coordinator (``drafting.factory``) leaves the link out and drafts a tree on a miss, and
    so must the plan. At the round trip's worth less, the link's absence changes nothing."""
    base = load_profile("m2-ultra-27b")
    link_s = planned.link(base).rtt_s
    slack = 0.15e-3  # less than the link's round trip: the worker fits only with it counted
    assert link_s > slack
    round_s = miss_round_s(planned.target(base).verify_s(1), base.stream_per_round_s)  # as the coordinator
    pass_s = (round_s + slack - WORKER_SETTLE_S) / 2.5
    worker = Machine("edge", PassCurve(decode_tok_s=1 / pass_s))
    assert miss_shape(pass_s, round_s + link_s) == "ar"  # with the link counted it would fit
    assert remote_tree(base, [worker], 8, 1, 50).miss == "tree"
    quicker = Machine("quicker", PassCurve(decode_tok_s=1 / (pass_s - slack)))
    assert remote_tree(base, [quicker], 8, 1, 50).miss == "ar"


def test_a_worker_too_slow_to_have_a_tree_ready_leaves_local_trees_and_pays_the_link() -> None:
    paper = load_profile("paper")
    slow = Machine("slow", PassCurve(decode_tok_s=0.1))
    t = remote_tree(paper, [slow], 8, 16, ROUNDS)
    assert t.local_share == pytest.approx(1.0, abs=0.01)
    local = local_tree(paper, 8)
    window = planned.link(paper).rtt_s + paper.stream_per_round_s
    expected = local.tokens / (local.tokens / local.tok_s + window)
    assert t.tok_s == pytest.approx(expected, rel=0.05)  # the Monte Carlo's noise at 1,500 rounds


def test_a_worker_faster_than_the_verdicts_sends_bigger_trees_than_local_ones_and_beats_them() -> None:
    paper = load_profile("paper")
    quick = Machine("quick", PassCurve(decode_tok_s=2000.0))  # many passes of 16 rows a verification
    t = remote_tree(paper, [quick], 8, 16, ROUNDS // 3)  # its trees are large: fewer rounds
    local = local_tree(paper, 8)
    # A verdict whose last token the draft did not guess (beyond its top 4) is new to any worker: about
    # half the rounds still take a local tree, however fast the worker.
    assert 0.2 < t.local_share < 0.7
    assert t.nodes > local.nodes and t.tok_s > local.tok_s * 1.2


def test_a_second_worker_adds_rows_to_the_same_tree() -> None:
    paper = load_profile("paper")
    one = Machine("one", PassCurve(decode_tok_s=400.0))
    alone = remote_tree(paper, [one], 8, 4, ROUNDS)
    together = remote_tree(paper, [one, replace(one, name="two")], 8, 4, ROUNDS)
    assert together.tok_s > alone.tok_s


def test_a_workers_tree_pass_is_as_wide_as_costs_no_more_than_sixteen_rows() -> None:
    sizes = (1, 2, 4, 8, 16, 32, 64)  # as a worker measures its passes (worker.server.speed)
    paper = load_profile("paper")
    for key, rows in (("m1-max", 32), ("m2-pro", 32)):  # flat to 35 and 32 rows, then rising
        curve = paper.machine(key).draft
        assert curve is not None
        assert tree_rows([(n, curve.pass_s(1, n)) for n in sizes]) == rows, key
        # The planner predicts the set-up auto opens: its curve read as a worker's Hello gives it.
        assert curve_tree_rows(curve) == rows, key
        wide = remote_tree(paper, [paper.machine(key)], 8, rows, TREE_ROUNDS).tok_s
        assert predict_setup(paper, Setup("tree-verify", 8, paper.machine(key).name)) == wide
    assert curve_tree_rows(PassCurve(1000.0, None, 1e-4)) == 16  # a CPU's line
    assert tree_rows([(n, 1e-3 + 1e-4 * n) for n in sizes]) == 16  # a CPU's: every row costs
    assert tree_rows([(n, 0.02) for n in sizes]) == 64  # flat as far as a pass may go
    assert tree_rows([(1, 0.02)]) == 16  # nothing measured past one row
