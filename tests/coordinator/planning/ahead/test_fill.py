"""Fill mode, predicted: the chain over drafts served, against its limits and the paper's machines."""

from __future__ import annotations

import pytest

import coordinator.planning.profile as planned
from coordinator.commands.plan import project_profile
from coordinator.planning.ahead.prespec import Outcomes, _branches, fill_schedule
from coordinator.planning.model import Transport, predict
from specwire.emulation.paper import profile

OUTCOMES = Outcomes(0.7, {"top1": 0.66, "top2": 0.77, "top4": 0.84})


def test_a_worker_too_slow_to_draft_ahead_leaves_every_draft_to_the_target_machine() -> None:
    s = fill_schedule(OUTCOMES, 2, draft_s=1.0, ahead_s=1.0, local_s=0.007, window_s=0.026)
    assert (s.hit, s.partial, s.miss, s.filled) == (0.0, 0.0, 1.0, 2.0)


def test_a_worker_fast_enough_serves_every_verdict_it_drafted_for() -> None:
    covered = sum(p for _, p in _branches(OUTCOMES, 2, 3))
    fast = {"draft_s": 1e-4, "ahead_s": 1e-4, "local_s": 0.007, "window_s": 0.026}
    s = fill_schedule(OUTCOMES, 2, **fast, budget=40, fanout=3)  # type: ignore[arg-type]
    assert s.hit == pytest.approx(covered) and s.partial == 0.0
    assert s.filled == pytest.approx(2 * (1 - covered))


def test_on_the_papers_macs_fill_beats_plain_prespeculation_but_not_local_sd_at_its_best_k() -> None:
    p = profile()
    t, link, m1 = planned.target(p), planned.link(p), p.workers[0]
    assert m1.draft is not None and p.local_draft is not None
    draft_s, local_s = 1 / m1.draft.decode_tok_s, 1 / p.local_draft.decode_tok_s
    acceptance = planned.acceptance(p)
    fill = planned.fill(p, draft_s, p.k, 8, m1.draft.pass_s(1, 8), 3)
    filled = predict(t, draft_s, acceptance, p.k, link, fill).tok_s
    plain = predict(t, draft_s, acceptance, p.k, link, planned.prespec(p, draft_s, p.k)).tok_s
    local = predict(t, local_s, acceptance, p.k, link, Transport("local")).tok_s
    assert plain < filled <= local  # drafting here is never worse than waiting for the worker


def test_plan_names_the_set_up_to_use_on_the_papers_macs() -> None:
    out = project_profile(
        profile()
    )  # no worker trees (their Monte Carlos are off); local tree SD is closed form
    backends = {r["backend"] for r in out["rows"]}
    assert backends == {"local SD", "local tree SD", "stream", "ggml-rpc/op", "ggml-rpc/token"}
    # Drafting on the M2 Ultra itself at k = 2 beats every remote chain these machines allow, and a tree
    # drafted there and verified in one pass (17 positions at the cost of one) beats that.
    local = next(r for r in out["rows"] if r["backend"] == "local SD")
    assert (local["best_k"], local["best_tok_s"]) == (2, pytest.approx(57.92, abs=0.01))
    chains = [r["best_tok_s"] for r in out["rows"] if r["machine"] != "target machine"]
    assert max(chains) < local["best_tok_s"]
    use = out["use"]
    assert (use["machine"], use["backend"]) == ("target machine", "local tree SD")
    assert use["best_tok_s"] > local["best_tok_s"] * 1.05
