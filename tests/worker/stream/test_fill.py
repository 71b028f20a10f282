"""Fill mode on the worker: every Round answered at once with what is ready, the rest drafted after.

In-process sessions on tiny models check what is answered (a hit's k drafts,
a branch under way's first few, a miss's none), that the block finished
afterwards is the one drafting on demand gives; a real worker checks that a
malformed fill Round ends only its own session.
"""

from __future__ import annotations

import anyio
import grpc
import pytest

from specwire.drafting.drafter import Drafter
from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import DRAFT_METHOD, PROTOCOL_VERSION, sampling_to_pb
from tests.support.credentials import channel as worker_channel
from tests.support.messages import open_request
from tests.support.models.tiny_models import disagreeing_pair, hybrid_pair
from tests.support.processes.workers import WorkerProcess
from worker.server.hosting import WorkerCounters
from worker.stream.session import DraftSession

PROMPT = [2, 5, 1]
K = 3


@pytest.fixture(scope="module")
def pair() -> tuple[LoadedModel, LoadedModel]:
    """Tiny models that disagree, so every kind of verdict comes up."""
    return disagreeing_pair()


def _open_fields(model: LoadedModel) -> dict:
    return {
        "protocol_version": PROTOCOL_VERSION,
        "prompt_tokens": PROMPT,
        "sampling": sampling_to_pb(SamplingParams()),
        "k": K,
        "vocab_fingerprint": model.fingerprint,
    }


def _session(model: LoadedModel, **prespec: int | bool) -> DraftSession:
    msg = pb.Open(**_open_fields(model), prespec=pb.PreSpeculation(enabled=True, fill=True, **prespec))
    session = DraftSession(model, msg, WorkerCounters())
    session.prefill()
    return session


def _on_demand(draft: LoadedModel, verdicts: list[tuple[int, int]]) -> list[list[int]]:
    """The blocks drafting on demand gives: round 0, then one after each verdict."""
    reference = Drafter(draft.model, SamplingParams())
    reference.start(PROMPT)
    blocks = [reference.draft(K).tokens]
    for accepted, token in verdicts:
        reference.apply(accepted, token)
        blocks.append(reference.draft(K).tokens)
    return blocks


def _round(seq: int, sent: list[int], accepted: int, token: int) -> pb.Round:
    return pb.Round(seq=seq, accepted=accepted, token=token, k=K, appended=[*sent[:accepted], token])


def test_each_round_is_answered_with_what_is_ready_and_finished_afterwards(
    pair: tuple[LoadedModel, LoadedModel],
) -> None:
    draft = pair[1]
    session = _session(draft, budget=40)
    assert session.speculator is not None
    sent = session.first_drafts().block.tokens
    session.plan_speculation()
    for _ in range(3):  # the bonus probe, then two passes of the most likely branch
        assert session.speculate()
    ((accepted, token),) = [key for key, b in session.speculator.branches.items() if b.block is not None]

    # A branch under way: its two drafts, at once, with no compute.
    partial = session.answer_ready(_round(1, sent, accepted, token))
    assert partial.ready == 2 and partial.computed.outcome == pb.SPECULATION_PARTIAL
    assert partial.computed.block.compute_ns > 0  # drafted ahead
    assert partial.computed.started_ns == partial.computed.finished_ns  # nothing computed on the answer
    session.settle_ready(partial)
    assert session.speculate()  # the third draft: the block is finished before anything is planned
    expected = _on_demand(draft, [(accepted, token)])
    assert partial.computed.block.tokens == expected[1][:2]
    assert session.drafter.last_drafts == expected[1]
    sent = expected[1]

    # A verdict nothing was drafted for: no drafts, and the block drafted afterwards.
    likely = {key[1] for key in session.speculator.branches}
    unlikely = next(t for t in range(draft.vocab_size) if t not in likely and t != sent[0])
    miss = session.answer_ready(_round(2, sent, 0, unlikely))
    assert miss.ready == 0 and miss.computed.block.tokens == []
    assert miss.computed.outcome == pb.SPECULATION_MISS
    session.settle_ready(miss)
    for _ in range(K):
        assert session.speculate()
    assert session.drafter.last_drafts == _on_demand(draft, [(accepted, token), (0, unlikely)])[2]

    # With the whole budget spent ahead, the most likely verdict is a hit of all k drafts.
    sent = session.drafter.last_drafts
    while session.speculate():
        pass
    done = [key for key, b in session.speculator.branches.items() if b.block is not None and b.block.done]
    hit = session.answer_ready(_round(3, sent, *done[0]))
    assert hit.ready == K and hit.computed.outcome == pb.SPECULATION_HIT
    assert (session.hits, session.partial, session.misses) == (1, 1, 1)


def test_fill_rounds_spell_out_the_appended_tokens_and_may_count_the_coordinators_drafts(
    pair: tuple[LoadedModel, LoadedModel],
) -> None:
    session = _session(pair[1])
    session.first_drafts()
    with pytest.raises(InvalidArgumentError, match="must carry appended"):
        session.check_round(pb.Round(seq=1, accepted=0, token=3, k=K))
    with pytest.raises(InvalidArgumentError, match="exceeds the 3 drafts"):
        session.check_round(pb.Round(seq=1, accepted=4, token=3, k=K, appended=[1, 2, 3, 4, 3]))
    # All three accepted, though the worker may have sent fewer: the coordinator drafted the rest.
    session.check_round(pb.Round(seq=1, accepted=3, token=4, k=K, appended=[7, 7, 7, 4]))
    # A session opened ahead is caught up on more tokens than it drafted, but only with them spelt out.
    session.check_round(pb.Round(seq=1, accepted=4, token=3, k=K, appended=[1, 2, 3, 4, 3], catch_up=True))
    plain = DraftSession(pair[1], pb.Open(**{**_open_fields(pair[1]), "prespec": None}), WorkerCounters())
    plain.prefill()
    plain.first_drafts()
    with pytest.raises(InvalidArgumentError, match="catch_up needs a fill session"):
        plain.check_round(pb.Round(seq=1, accepted=0, token=3, k=K, appended=[3], catch_up=True))


@pytest.mark.parametrize(
    ("tree", "hybrid"), [(False, False), (True, False), (True, True)], ids=["fill", "tree", "hybrid-tree"]
)
def test_a_session_caught_up_drafts_what_one_opened_after_the_whole_context_drafts(
    pair: tuple[LoadedModel, LoadedModel], tree: bool, hybrid: bool
) -> None:
    """``Round.catch_up``: a session opened ahead (auto's move to a worker, made while the target went
    on without it) is given every token decoded since, more than it drafted; its next drafts are those
    drafting on demand gives after the whole context (a hybrid draft's tree: its Gated DeltaNet states
    fed through the tokens too)."""
    draft = hybrid_pair()[1] if hybrid else pair[1]
    session = _session(draft, tree=tree)
    session.first_drafts()
    decoded = [6, 4, 7, 2, 7, 5]  # no verdict on its drafts: the target decoded them without it
    msg = pb.Round(seq=1, accepted=len(decoded) - 1, token=decoded[-1], k=K, appended=decoded, catch_up=True)
    ready = session.answer_ready(msg)
    session.settle_ready(ready)
    while session.speculate():  # the block (a tree: its passes) drafted after the answer
        pass
    reference = Drafter(draft.model, SamplingParams())
    reference.start(PROMPT + decoded)
    expected = reference.draft(K).tokens
    if session.tree is not None:
        assert session.tree.ready([], K)[0] == expected  # the tree's first choices from its new root
    else:
        assert session.drafter.last_drafts == expected
    assert session.drafter.context == PROMPT + decoded


@pytest.mark.anyio
async def test_a_malformed_fill_round_ends_only_its_session(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    fill = pb.PreSpeculation(enabled=True, fill=True)
    async with worker_channel(tiny_worker.address) as channel:
        bad = channel.stream_stream(DRAFT_METHOD)(timeout=60)
        good = channel.stream_stream(DRAFT_METHOD)(timeout=60)
        for call in (bad, good):
            await call.write(open_request(tiny.fingerprint, [1, 2, 3], K, fill))
            assert pb.DraftReply.FromString(await call.read()).WhichOneof("kind") == "opened"
            first = pb.DraftReply.FromString(await call.read()).drafts
            assert len(first.tokens) == K
        no_appended = pb.Round(seq=1, accepted=1, token=5, k=K)
        await bad.write(pb.DraftRequest(round=no_appended).SerializeToString())
        with anyio.fail_after(30), pytest.raises(grpc.aio.AioRpcError) as err:
            await bad.read()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "must carry appended" in (err.value.details() or "")
        ok = pb.Round(seq=1, accepted=K, token=5, k=K, appended=[*first.tokens, 5])
        await good.write(pb.DraftRequest(round=ok).SerializeToString())
        reply = pb.DraftReply.FromString(await good.read()).drafts
        assert reply.seq == 1 and reply.speculation.outcome in (
            pb.SPECULATION_HIT,
            pb.SPECULATION_PARTIAL,
            pb.SPECULATION_MISS,
        )
        await good.done_writing()
