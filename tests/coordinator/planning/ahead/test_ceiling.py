"""The ceiling of drafting off the critical path (``coordinator/planning/ahead/ceiling.py``) at its limits."""

from __future__ import annotations

import pytest

from coordinator.commands.plan import project_profile
from coordinator.planning import profile as planned
from coordinator.planning.ahead.ceiling import Worker, ceiling
from coordinator.planning.ahead.prespec import Outcomes
from specwire.emulation.paper import load_profile

ALPHA = 0.7
VERIFY_S, LOCAL_S = 0.024, 0.007
PAPER_AGREEMENT = {"top1": 0.664, "top2": 0.768, "top4": 0.842}


def window(k: int) -> float:
    return VERIFY_S + 0.002  # verification, link and protocol, flat in k as on a GPU


def best_local(ready: int, k_max: int = 8) -> float:
    """tok/s when every round has ``ready`` drafts made ahead and the rest drafted on the critical path."""
    return max(
        sum(ALPHA**i for i in range(k + 1)) / (window(k) + max(0, k - ready) * LOCAL_S)
        for k in range(1, k_max + 1)
    )


def test_a_worker_too_slow_for_any_pass_leaves_drafting_where_it_was() -> None:
    slow = [Worker(lambda n: 10.0, 8)]
    c = ceiling(Outcomes(ALPHA, PAPER_AGREEMENT), slow, 8, window, LOCAL_S, rounds=1500)
    assert c.ready == {0: 1.0}
    assert c.tok_s == pytest.approx(best_local(0), rel=0.04)  # the Monte Carlo's noise at 1,500 rounds


def test_a_quick_worker_that_guesses_every_token_has_every_draft_ready() -> None:
    sure = Outcomes(ALPHA, {"top1": ALPHA, "top2": 1.0, "top4": 1.0})  # the target's token is a top-2
    quick = [Worker(lambda n: 0.002, 8)]  # 13 passes of 8 rows a verification
    c = ceiling(sure, quick, 2, window, LOCAL_S, rounds=1500)
    assert c.ready[2] > 0.99 and c.mean_k == 2  # all but the first round, before any pass
    assert c.tok_s == pytest.approx(best_local(2, k_max=2), rel=0.04)


def test_wider_and_faster_passes_raise_the_ceiling_and_a_seed_repeats_it() -> None:
    outcomes = Outcomes(ALPHA, PAPER_AGREEMENT)

    def tok_s(pass_s: float, rows: int) -> float:
        return ceiling(outcomes, [Worker(lambda n: pass_s, rows)], 8, window, LOCAL_S, rounds=1000).tok_s

    m1_max = tok_s(0.0115, 8)
    assert tok_s(0.0115, 8) == m1_max
    assert tok_s(0.0115, 1) < m1_max < tok_s(0.006, 8)
    # A pass that fits about twice into a verification: at the paper's pair, near local SD's own rate.
    assert m1_max < 1.15 * best_local(0)


def test_idling_while_the_coordinator_fills_and_looking_one_round_ahead_cost_throughput() -> None:
    outcomes = Outcomes(ALPHA, {"top1": ALPHA, "top2": 0.85, "top4": 0.93})

    def tok_s(**restrict: bool) -> float:
        m1_max = [Worker(lambda n: 0.0115, 8)]
        return ceiling(outcomes, m1_max, 2, window, LOCAL_S, rounds=1500, **restrict).tok_s

    full, idle = tok_s(), tok_s(idle_while_filling=True)
    assert idle < 0.98 * full  # about 4% (5% at 10,000 rounds): the passes lost while waiting
    assert tok_s(idle_while_filling=True, one_round_ahead=True) <= idle * 1.01


def test_the_built_tree_pays_on_the_m1_max_below_its_ceiling_and_tree_verification_pays_more() -> None:
    # The tree as built verifies a fixed k and learns a draft only by expanding the node before it.
    paper = load_profile("paper")
    m1_max = paper.machine("m1-max")
    assert m1_max.draft is not None and paper.local_draft is not None
    built = planned.tree(paper, m1_max, 2, 8, rounds=1500).tok_s
    outcomes = Outcomes(planned.acceptance(paper).profile[0], paper.agreement)
    local_s = 1 / paper.local_draft.decode_tok_s
    free = ceiling(
        outcomes,
        [Worker(m1_max.draft.pass_s, 8)],
        2,
        lambda k: planned.window(paper, k),
        local_s,
        rounds=1500,
    ).tok_s
    plan = project_profile(paper, ceiling_rounds=300)
    local = next(r["best_tok_s"] for r in plan["rows"] if r["backend"] == "local SD")
    assert local < built < free
    tree = next(
        r for r in plan["rows"] if (r["machine"], r["backend"]) == ("M1 Max", "stream+prespec+fill+tree")
    )
    assert tree["best_tok_s"] > local and tree["rows"] == 16
    # Verifying a tree in one pass pays more than a chain from the tree: the plan names it.
    assert (plan["use"]["machine"], plan["use"]["backend"]) == ("target machine", "local tree SD")
    assert plan["use"]["best_tok_s"] > tree["best_tok_s"]
