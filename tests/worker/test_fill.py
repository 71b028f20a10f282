"""Fill mode on the worker: every Round answered at once with what is ready, the rest drafted after.

In-process sessions on tiny models check what is answered (a hit's k drafts,
a branch under way's first few, a miss's none), that the block finished
afterwards is the one drafting on demand gives, and that a block the
coordinator finished and pushed (Filled) is taken in one pass and planned
from exactly as if drafted here; a real worker checks that a malformed fill
Round or Filled message ends only its own session.
"""

from __future__ import annotations

import asyncio

import anyio
import grpc
import pytest

from specwire.drafter import Drafter
from specwire.errors import InvalidArgumentError
from specwire.models import LoadedModel
from specwire.protocol import DRAFT_METHOD, PROTOCOL_VERSION, sampling_to_pb
from specwire.sampling import SamplingParams
from specwire.v1 import draft_pb2 as pb
from tests.support.credentials import channel as worker_channel
from tests.support.messages import open_request
from tests.support.tiny_models import disagreeing_pair
from tests.support.workers import WorkerProcess
from worker.hosting import WorkerCounters
from worker.session import DraftSession

PROMPT = [2, 5, 1]
K = 3


@pytest.fixture(scope="module")
def pair() -> tuple[LoadedModel, LoadedModel]:
    """Tiny models that disagree, so every kind of verdict comes up."""
    return disagreeing_pair()


def _session(model: LoadedModel, **prespec: int | bool) -> DraftSession:
    msg = pb.Open(
        protocol_version=PROTOCOL_VERSION,
        prompt_tokens=PROMPT,
        sampling=sampling_to_pb(SamplingParams()),
        k=K,
        vocab_fingerprint=model.fingerprint,
        prespec=pb.PreSpeculation(enabled=True, fill=True, **prespec),
    )
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


def _unlikely(session: DraftSession, sent: list[int]) -> int:
    """A verdict token no branch was planned for."""
    assert session.speculator is not None
    likely = {key[1] for key in session.speculator.branches} | {sent[0]}
    return next(t for t in range(session.model.vocab_size) if t not in likely)


def test_a_pushed_block_is_taken_in_one_pass_and_planned_from_as_if_drafted_here(
    pair: tuple[LoadedModel, LoadedModel],
) -> None:
    draft = pair[1]
    own, pushed = _session(draft, budget=40), _session(draft, budget=40, push=True)
    sent = own.first_drafts().block.tokens
    assert pushed.first_drafts().block.tokens == sent
    for session in (own, pushed):
        session.plan_speculation()
    token = _unlikely(own, sent)
    block = _on_demand(draft, [(0, token)])[1]
    for session in (own, pushed):
        answer = session.answer_ready(_round(1, sent, 0, token))
        assert answer.ready == 0
        session.settle_ready(answer)

    assert not pushed.speculate()  # it waits for the coordinator's drafts rather than drafting them
    for _ in range(K):  # the other drafts the block's rest itself, a pass a draft
        assert own.speculate()
    before = pushed.forward_passes
    filled = pb.Filled(seq=1, tokens=block)
    pushed.check_filled(filled)
    assert pushed.take_filled(filled)
    assert pushed.forward_passes == before + 1 and pushed.filled_rounds == 1
    pushed.plan_speculation()
    assert own.drafter.last_drafts == pushed.drafter.last_drafts == block
    for session in (own, pushed):
        while session.speculate():
            pass
    assert own.speculator is not None and pushed.speculator is not None
    branches = [
        {key: b.block.tokens for key, b in s.speculator.branches.items() if b.block is not None}
        for s in (own, pushed)
    ]
    assert branches[0] == branches[1] and len(branches[0]) > 2  # the probe's bonus branches included
    assert any(key[0] == K for key in branches[0])
    verdict = next(key for key in branches[0] if key[0] == K)
    for session in (own, pushed):
        hit = session.answer_ready(_round(2, block, *verdict))
        assert hit.ready == K and hit.computed.block.tokens == _on_demand(draft, [(0, token), verdict])[2]

    # A Filled equal to a block finished here changes nothing; one that differs is taken and replanned.
    session = _session(draft, budget=40)
    sent = session.first_drafts().block.tokens
    session.plan_speculation()
    answer = session.answer_ready(_round(1, sent, 0, token))
    session.settle_ready(answer)
    while session.speculate():
        pass
    same = pb.Filled(seq=1, tokens=block)
    session.check_filled(same)
    assert not session.take_filled(same)
    other = session.answer_ready(_round(2, block, *verdict))
    session.settle_ready(other)
    own_block = list(session.drafter.last_drafts) if other.ready == K else None
    assert own_block is not None
    changed = [*own_block[:-1], (own_block[-1] + 1) % draft.vocab_size]
    session.check_filled(pb.Filled(seq=2, tokens=changed))
    assert session.take_filled(pb.Filled(seq=2, tokens=changed))
    assert session.drafter.last_drafts == changed


def test_split_workers_share_the_branches_whether_pushed_or_not(
    pair: tuple[LoadedModel, LoadedModel],
) -> None:
    # Two shards, one drafting the block's rest itself and one pushed it: their branches are disjoint,
    # and together they are a whole worker's.
    draft = pair[1]
    whole = _session(draft, budget=40, batch=4)
    own = _session(draft, budget=40, batch=4, shard=0, shards=2)
    pushed = _session(draft, budget=40, batch=4, shard=1, shards=2, push=True)
    sessions = (whole, own, pushed)
    blocks = [s.first_drafts().block.tokens for s in sessions]
    assert blocks[0] == blocks[1] == blocks[2]
    sent = blocks[0]
    for session in sessions:
        session.plan_speculation()
    token = _unlikely(whole, sent)
    block = _on_demand(draft, [(0, token)])[1]
    for session in sessions:
        session.settle_ready(session.answer_ready(_round(1, sent, 0, token)))
    filled = pb.Filled(seq=1, tokens=block)
    pushed.check_filled(filled)
    assert pushed.take_filled(filled)
    pushed.plan_speculation()
    started = []
    for session in sessions:
        while session.speculate():
            pass
        assert session.speculator is not None
        started.append({key for key, b in session.speculator.branches.items() if b.block is not None})
    assert started[1] and started[2] and not started[1] & started[2]
    assert started[1] | started[2] == started[0]


def test_filled_messages_are_checked(pair: tuple[LoadedModel, LoadedModel]) -> None:
    draft = pair[1]
    plain = DraftSession(
        draft,
        pb.Open(
            protocol_version=PROTOCOL_VERSION,
            prompt_tokens=PROMPT,
            sampling=sampling_to_pb(SamplingParams()),
            k=K,
            vocab_fingerprint=draft.fingerprint,
        ),
        WorkerCounters(),
    )
    with pytest.raises(InvalidArgumentError, match="fill-mode sessions"):
        plain.check_filled(pb.Filled(seq=0, tokens=[1, 2, 3]))
    session = _session(draft, push=True)
    sent = session.first_drafts().block.tokens
    with pytest.raises(InvalidArgumentError, match="only the round answered last"):
        session.check_filled(pb.Filled(seq=0, tokens=sent))  # round 0 is drafted whole
    session.plan_speculation()
    session.settle_ready(session.answer_ready(_round(1, sent, 0, _unlikely(session, sent))))
    for bad, why in [
        (pb.Filled(seq=2, tokens=[1, 2, 3]), "only the round answered last"),
        (pb.Filled(seq=1, tokens=[1, 2]), "its k is 3"),
        (pb.Filled(seq=1, tokens=[1, 2, 3, 4]), "its k is 3"),
        (pb.Filled(seq=1, tokens=[1, 2, draft.vocab_size]), "outside the vocabulary"),
    ]:
        with pytest.raises(InvalidArgumentError, match=why):
            session.check_filled(bad)
    session.check_filled(pb.Filled(seq=1, tokens=[1, 2, 3]))
    with pytest.raises(InvalidArgumentError, match="once"):
        session.check_filled(pb.Filled(seq=1, tokens=[1, 2, 3]))


@pytest.mark.anyio
async def test_bad_filled_messages_end_only_their_sessions(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    push = pb.PreSpeculation(enabled=True, fill=True, push=True)
    async with worker_channel(tiny_worker.address) as channel:
        calls = {}
        for name, prespec in [("flood", push), ("seq", push), ("plain", None), ("good", push)]:
            call = channel.stream_stream(DRAFT_METHOD)(timeout=60)
            await call.write(open_request(tiny.fingerprint, [1, 2, 3], K, prespec))
            assert pb.DraftReply.FromString(await call.read()).WhichOneof("kind") == "opened"
            first = pb.DraftReply.FromString(await call.read()).drafts
            verdict = pb.Round(seq=1, accepted=K, token=5, k=K, appended=[*first.tokens, 5])
            await call.write(pb.DraftRequest(round=verdict).SerializeToString())
            assert pb.DraftReply.FromString(await call.read()).drafts.seq == 1
            calls[name] = call
        filled = pb.DraftRequest(filled=pb.Filled(seq=1, tokens=[7, 8, 9])).SerializeToString()
        for _ in range(50):  # a flood: the second one ends the session, and writing then fails
            try:
                await calls["flood"].write(filled)
            except (grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                break
        await calls["seq"].write(
            pb.DraftRequest(filled=pb.Filled(seq=2, tokens=[7, 8, 9])).SerializeToString()
        )
        await calls["plain"].write(filled)
        for name, why in [("flood", "once"), ("seq", "only the round answered last"), ("plain", "fill-mode")]:
            with anyio.fail_after(30), pytest.raises(grpc.aio.AioRpcError) as err:
                await calls[name].read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert why in (err.value.details() or ""), (name, err.value.details())
        good = calls["good"]
        await good.write(filled)
        ok = pb.Round(seq=2, accepted=1, token=4, k=K, appended=[7, 4])
        await good.write(pb.DraftRequest(round=ok).SerializeToString())
        reply = pb.DraftReply.FromString(await good.read()).drafts
        assert reply.seq == 2 and reply.counters.filled_rounds == 1 and reply.counters.messages_received == 4
        await good.done_writing()


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
