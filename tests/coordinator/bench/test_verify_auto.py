"""The bench's check of an ``auto`` row: each session it opened against the rounds that session served."""

from __future__ import annotations

from coordinator.bench.runner import verify_auto
from coordinator.decoding.results import GenerationResult, RoundRecord
from coordinator.drafting.auto.policy import AutoDraftSource
from coordinator.drafting.auto.report import Segment
from coordinator.planning.planner import Planner
from specwire.drafting.draft_block import DraftBlock
from tests.support.measured import paper_setup


def test_a_session_opened_as_the_generation_ended_is_unused_not_a_failed_check() -> None:
    """Measured on the hybrid preset: auto switched to a worker's set-up at the generation's last round; the
    session's open was sent and its reply never read, so its counters disagreed and the row printed no
    figure. A session that served no round drafted nothing; it is marked unused."""
    planner = Planner(paper_setup())
    auto = AutoDraftSource(planner, lambda setup: None)
    ranking = planner.ranking(0.0, 0.7)
    local, remote = (next(p.setup for p in ranking if p.setup.remote == r) for r in (False, True))
    auto.segments[:] = [Segment(local, None, 0, 2), Segment(remote, None, 3, 2)]  # the second served nothing
    rounds = [RoundRecord(0, 0, [7, 7], 0, 1, i + 1, DraftBlock([], None, 0, 0)) for i in range(3)]
    result = GenerationResult(3, [7] * 6, "length", 0, 0, 3, rounds=rounds)
    ok, counters, identities = verify_auto(auto, result)
    assert ok, identities
    assert identities["sessions"] == [{"setup": remote.label, "rounds": 0, "unused": True}]
    assert counters["rounds_by_setup"] == {local.label: 3, remote.label: 0}
