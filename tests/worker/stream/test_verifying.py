"""What the target verifies (``Verifying``), on the worker: checked, added to its tree, and the clock its
passes keep (in-process, tiny models).

A tree session's coordinator says, as each verification starts, which of the
worker's nodes it verifies and which it drafted itself. The worker refuses a
message that names anything it did not send, adds the coordinator's nodes to
its tree, and starts no pass that would end after the verdict it expects
(the reply, the coordinator's own drafting, then the verification windows it
has seen).
"""

from __future__ import annotations

import time

import pytest

from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import PROTOCOL_VERSION, sampling_to_pb
from tests.support.models.tiny_models import disagreeing_pair
from worker.server.hosting import WorkerCounters
from worker.stream.session import DraftSession
from worker.stream.window import MIN_WINDOWS

PROMPT = [2, 5, 1]


def _session() -> DraftSession:
    _, draft = disagreeing_pair()
    msg = pb.Open(
        protocol_version=PROTOCOL_VERSION,
        prompt_tokens=PROMPT,
        sampling=sampling_to_pb(SamplingParams()),
        k=2,
        vocab_fingerprint=draft.fingerprint,
        prespec=pb.PreSpeculation(enabled=True, fill=True, tree=True, batch=4, fanout=3),
    )
    session = DraftSession(draft, msg, WorkerCounters())
    session.prefill()
    return session


def _answered(session: DraftSession) -> tuple[pb.Round, list[int], list[int]]:
    """Round 1 asked for a tree after the first drafts were accepted; the tree it was answered with."""
    first = session.first_drafts().block.tokens
    for _ in range(3):
        session.speculate()
    msg = pb.Round(seq=1, accepted=len(first), token=7, k=4, appended=[*first, 7], tree_nodes=16)
    answer = session.answer_ready(msg)
    session.settle_ready(answer)
    tree = answer.computed.block.tree
    return msg, list(tree.tokens) if tree else [], list(tree.parents) if tree else []


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"seq": 0}, "latest answered is 1"),
        ({"reply_nodes": 999}, "it had"),
        ({"tokens": [3, 4], "parents": [-1]}, "2 tokens, 1 parents"),
        ({"tokens": [3], "parents": [5]}, "must be an earlier node"),
        ({"tokens": [10**6], "parents": [-1]}, "token"),
    ],
)
def test_a_verifying_that_names_what_the_worker_did_not_send_is_refused(fields: dict, says: str) -> None:
    session = _session()
    _answered(session)
    with pytest.raises(InvalidArgumentError, match=says):
        session.verifying(pb.Verifying(**{"seq": 1, **fields}))


def test_one_verifying_a_reply_and_none_outside_a_tree_session() -> None:
    session = _session()
    _, tokens, _ = _answered(session)
    session.verifying(pb.Verifying(seq=1, reply_nodes=len(tokens)))
    with pytest.raises(InvalidArgumentError, match="second Verifying"):
        session.verifying(pb.Verifying(seq=1, reply_nodes=len(tokens)))
    _, draft = disagreeing_pair()
    plain = DraftSession(
        draft,
        pb.Open(
            protocol_version=PROTOCOL_VERSION,
            prompt_tokens=PROMPT,
            sampling=sampling_to_pb(SamplingParams()),
            k=2,
            vocab_fingerprint=draft.fingerprint,
        ),
        WorkerCounters(),
    )
    with pytest.raises(InvalidArgumentError, match="drafts a tree"):
        plain.verifying(pb.Verifying(seq=0))


def test_the_coordinators_own_nodes_join_the_tree_under_a_node_it_expanded() -> None:
    session = _session()
    _answered(session)
    tree = session.tree
    assert tree is not None
    while tree.table.first[0] == -1:  # the root expanded: its children are known
        assert session.speculate()
    t = tree.table
    children = {int(t.token[i]) for i in range(t.size) if t.parent[i] == 0}
    stranger = next(tok for tok in range(2, 500) if tok not in children)
    session.verifying(pb.Verifying(seq=1, tokens=[stranger], parents=[-1]))
    session.speculate()  # the next pass adds it first
    assert t.child(0, stranger) != -1


def test_no_pass_starts_that_would_end_after_the_verdict() -> None:
    session = _session()
    _answered(session)
    session.verifying(pb.Verifying(seq=1))  # told what is verified: the worker times its passes
    for _ in range(2):
        assert session.speculate()  # passes timed, so the tree knows how long one takes
    window_ns = 20_000_000
    base = time.perf_counter_ns()
    for i in range(MIN_WINDOWS):  # verdicts came 20 ms after each reply
        session.clock.replied(base + i * 2 * window_ns)
        session.note_round(base + i * 2 * window_ns + window_ns)
    session.clock.replied(time.perf_counter_ns() - window_ns - 10**9)  # the verdict is a second overdue
    assert not session.speculate()
    session.clock.replied(time.perf_counter_ns())  # a whole window ahead: a pass fits
    assert session.speculate()


def test_a_pass_is_sized_to_the_time_left_by_the_workers_curve() -> None:
    session = _session()
    tree = session.tree
    assert tree is not None
    tree.rows = 64
    tree.set_curve([(1, 0.016), (2, 0.012), (16, 0.012)])  # a cold first point: no narrower pass costs more
    assert tree.pass_estimate(1) == tree.pass_estimate(16) == 0.012
    assert tree.rows_within(0.013) == 17  # past the last point, in proportion to it
    assert tree.rows_within(0.030) == 40 and tree.rows_within(0.011) == 0
