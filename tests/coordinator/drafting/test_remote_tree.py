"""Remote tree verification: a worker's tree under each verdict, verified in one pass.

In-process first (the worker's session code without gRPC, on tiny models
that disagree), then through a real worker over gRPC: the output is the
target's own at T = 0, rounds are served from the worker's tree and, when it
has nothing ready, from a tree drafted here, and the worker's counters
account for every node it sent. A malformed tree ends the session with a
clear error naming the worker.
"""

from __future__ import annotations

import functools
import time

import pytest

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.local_tree import VerifyCurve
from coordinator.drafting.remote_tree import RemoteTreeDraftSource
from coordinator.drafting.stream import StreamDraftSource
from coordinator.runtime import coordinator_runtime
from coordinator.workers.connection import connect
from coordinator.workers.stream_call import CLOSE_TIMEOUT_S
from specwire.drafting.sampling import SamplingParams
from specwire.errors import RemoteWorkerError
from specwire.models.loading import LoadedModel, load_model
from specwire.v1 import draft_pb2 as pb
from tests.support.credentials import credentials
from tests.support.messages import fields_of
from tests.support.models.tiny_models import disagreeing_pair
from tests.support.processes.workers import WorkerProcess
from tests.support.prompts import PROMPTS
from tests.support.remote import sessions_active, sessions_drained
from tests.support.session_source import SessionSource

TREE = pb.PreSpeculation(enabled=True, fill=True, tree=True, batch=4, fanout=2)
FLAT = VerifyCurve((1, 64), (1.0, 1.0))  # positions are free: every node the worker sends is verified


@pytest.mark.parametrize("budget", [1, 3, 8])
@pytest.mark.parametrize("miss", ["tree", "ar"])
def test_worker_trees_are_lossless_and_a_worker_with_none_ready_leaves_a_local_tree_or_a_lone_token(
    budget: int, miss: str
) -> None:
    target, draft = disagreeing_pair()
    prompt, params = [2, 5, 1], SamplingParams()
    ar = SpeculativeDecoder(target).generate(prompt, max_tokens=60, k=0, params=params)
    worker = SessionSource(draft, pb.PreSpeculation(**{**fields_of(TREE), "budget": budget}), tree_nodes=16)
    source = RemoteTreeDraftSource(worker, draft, FLAT, miss)
    result = SpeculativeDecoder(target, source).generate(prompt, max_tokens=60, k=6, params=params)
    assert result.tokens == ar.tokens  # hits, partial hits and misses alike
    asked = result.rounds[1 : len(result.rounds) - (result.rounds[-1].k == 0)]
    trees = [r for r in asked if r.draft.tree is not None and not r.draft.filled]
    local = [r for r in asked if r not in trees]
    assert local and source.filled == len(local)
    if miss == "ar":  # nothing ready: the verdict's token alone
        assert all(not r.draft.tokens for r in local)
    else:
        assert all(r.draft.filled == len(r.draft.tokens) > 0 for r in local)
    # The worker was told what each round verified: its own first nodes, or the tree drafted here.
    assert len(worker.verified) == len(asked)
    for r, told in zip(asked, worker.verified, strict=True):
        if r.draft.filled or not r.draft.tokens:
            assert told.reply_nodes == 0 and list(told.tokens) == list(r.draft.tokens)
        else:
            assert told.reply_nodes == len(r.draft.tokens) and not told.tokens
    if budget >= 3:  # a worker that runs ahead serves rounds from its own tree
        assert trees
    if budget >= 8:  # far enough ahead that the target accepts deep into it
        assert max(r.accepted for r in trees) >= 2


def test_a_tree_is_cut_to_what_pays_on_the_verification_curve() -> None:
    target, draft = disagreeing_pair()
    steep = VerifyCurve((1, 2, 64), (1.0, 2.0, 64.0))  # each position a pass: a tree rarely pays
    worker = SessionSource(draft, pb.PreSpeculation(**{**fields_of(TREE), "budget": 8}), tree_nodes=16)
    source = RemoteTreeDraftSource(worker, draft, steep)
    SpeculativeDecoder(target, source).generate([2, 5, 1], max_tokens=40, k=6, params=SamplingParams())
    assert source.trimmed > 0  # the source counts the nodes it left out


@pytest.mark.anyio
async def test_trees_through_a_worker_are_lossless_and_every_node_is_counted(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    prompt = tiny.tokenizer.encode(PROMPTS[0])
    draft = load_model("tiny")
    async with coordinator_runtime() as runtime:
        connection = await connect(tiny_worker.address, credentials())
        try:
            remote = StreamDraftSource(
                runtime.portal, connection, tiny.fingerprint, prespec=TREE, tree_nodes=24
            )
            source = RemoteTreeDraftSource(remote, draft, FLAT)
            decoder = SpeculativeDecoder(tiny, source)
            params = SamplingParams()
            ar = await runtime.compute.run(
                SpeculativeDecoder(tiny).generate, prompt, max_tokens=48, k=0, params=params
            )
            result = await runtime.compute.run(decoder.generate, prompt, max_tokens=48, k=6, params=params)
            assert result.tokens == ar.tokens
            counters = remote.worker_counters
            asked = [r for r in result.rounds if r.draft.calls]
            assert counters.rounds == len(asked)
            assert counters.draft_tokens == sum(r.drafted - r.draft.filled + r.draft.trimmed for r in asked)
        finally:
            await connection.close()


@pytest.mark.anyio
@pytest.mark.parametrize("read_ahead", [False, True], ids=["unread", "read-ahead"])
async def test_a_session_closed_before_its_first_round_ends_at_once(
    tiny_worker: WorkerProcess, tiny: LoadedModel, read_ahead: bool
) -> None:
    # serve closes a session this early when its request joins a batch; the worker's first drafts,
    # sent unasked after the prefill, are still unread, and the close once waited out its timeout.
    # auto closes one whose Open it is reading ahead (``arrived``) when the generation ends first; the
    # read's cancel cancelled the call, and the close raised CancelledError out of the bench.
    prompt = tiny.tokenizer.encode(PROMPTS[0]) * 300  # the worker's prefill outlasts the close
    async with coordinator_runtime() as runtime:
        connection = await connect(tiny_worker.address, credentials())
        try:
            for _ in range(2):  # the same connection serves a session after the close
                remote = StreamDraftSource(
                    runtime.portal, connection, tiny.fingerprint, prespec=TREE, tree_nodes=24
                )
                source = RemoteTreeDraftSource(remote, load_model("tiny"), FLAT)

                assert not await runtime.compute.run(_open, source, prompt, read_ahead)
                started = time.perf_counter()
                await runtime.compute.run(source.close)
                assert time.perf_counter() - started < CLOSE_TIMEOUT_S / 2
        finally:
            await connection.close()


@pytest.mark.anyio
async def test_a_session_closed_soon_is_ended_on_the_worker_and_its_local_draft_never_prefilled(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    # auto's moves close the session they leave without waiting for the worker (``close_soon``), and a
    # session whose misses verify the verdict's token alone never starts its local draft.
    prompt = tiny.tokenizer.encode(PROMPTS[0])
    async with coordinator_runtime() as runtime:
        connection = await connect(tiny_worker.address, credentials())
        try:
            await sessions_drained(tiny_worker.address)  # sessions of earlier tests end as the worker sees it
            remote = StreamDraftSource(
                runtime.portal, connection, tiny.fingerprint, prespec=TREE, tree_nodes=24
            )
            source = RemoteTreeDraftSource(remote, load_model("tiny"), FLAT, miss="ar")
            decoder = SpeculativeDecoder(tiny, source)
            decoding = await runtime.compute.run(
                functools.partial(decoder.begin, prompt, max_tokens=160, k=6, params=SamplingParams())
            )
            # Until a round misses (a lone token): a worker with time to spare (a loaded make test,
            # 2026-11-29) had every one of the first three rounds ready.
            while source.filled == 0 and await runtime.compute.run(decoding.round):
                pass
            assert await sessions_active(tiny_worker.address) == 1
            assert source.filled > 0 and not source.local_started  # rounds missed: a lone token each
            await runtime.compute.run(source.close_soon)
            await sessions_drained(tiny_worker.address)
        finally:
            await connection.close()


def _open(source: RemoteTreeDraftSource, prompt: list[int], read_ahead: bool) -> bool:
    """Open ``source``'s session and, if ``read_ahead``, look whether the Open's drafts are in (auto's
    ``arrived``): whether they were."""
    source.start(prompt, SamplingParams(), 6)
    return read_ahead and source.arrived()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("tokens", "parents", "says"),
    [
        ([5, 6], [-1], "one parent per token"),
        ([5, 6], [-1, 1], "must be an earlier node"),
        ([5, 6, 7], [-1, 0, 1], "at most 2"),
        ([5, 6, 7, 8, 9, 10, 11], [-1, 0, 1, 2, 3, 4, 5], "7 deep"),
        ([5, 60_000], [-1, 0], "outside a vocabulary"),
    ],
)
async def test_a_malformed_tree_from_a_worker_is_refused_naming_it(
    tiny_worker: WorkerProcess, tiny: LoadedModel, tokens: list[int], parents: list[int], says: str
) -> None:
    async with coordinator_runtime() as runtime:
        connection = await connect(tiny_worker.address, credentials())
        try:
            remote = StreamDraftSource(
                runtime.portal, connection, tiny.fingerprint, prespec=TREE, tree_nodes=2
            )
            remote._tree_nodes = 8 if says == "7 deep" else 2
            drafts = pb.Drafts(seq=1, tokens=tokens, parents=parents)
            with pytest.raises(
                RemoteWorkerError, match=rf"worker {connection.name} sent a malformed tree: .*{says}"
            ):
                remote._tree_of(drafts, k=6)
        finally:
            await connection.close()
