"""Tree pre-speculation on the worker (``specwire.drafting.ahead.draft_tree``), in-process on tiny models.

A fill-mode session with ``PreSpeculation.tree`` answers each Round with the
chain of first choices its tree holds after the verdict. Those drafts must be
exactly the ones a fresh drafter gives for the real prefix, whatever the
verdicts (accepted runs, corrections the tree guessed and ones it did not,
drafts the coordinator made past the tree), and a tree that runs ahead must
serve whole rounds. What a tree cannot draft for is refused, and on a real
worker that ends only the session that asked.
"""

from __future__ import annotations

import anyio
import grpc
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from specwire.drafting.ahead.draft_tree import DraftTree, TreeMemory
from specwire.drafting.ahead.prespec_config import PrespecConfig
from specwire.drafting.choices import top_choices
from specwire.drafting.drafter import Drafter
from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import DRAFT_METHOD, PROTOCOL_VERSION, sampling_to_pb
from tests.support.credentials import channel as worker_channel
from tests.support.messages import fields_of, open_request
from tests.support.models.tiny_models import disagreeing_pair, hybrid_pair
from tests.support.processes.workers import WorkerProcess
from worker.server.hosting import WorkerCounters
from worker.stream.checks import check_tree, prespec_config
from worker.stream.session import DraftSession

PROMPT = [2, 5, 1]
GPU_RTOL = 1e-2  # a hybrid node's state on a GPU, against the largest entry of a plain pass's
K = 3
ROUNDS = 20


@pytest.fixture(scope="module", params=["llama", "hybrid"])
def pair(request: pytest.FixtureRequest) -> tuple[LoadedModel, LoadedModel]:
    """Tiny models that disagree, so every kind of verdict comes up: llama's, and Qwen3.5's hybrid
    (Gated DeltaNet layers, whose state each node keeps)."""
    return disagreeing_pair() if request.param == "llama" else hybrid_pair()


def _open(
    draft: LoadedModel,
    params: SamplingParams | None = None,
    memory: TreeMemory | None = None,
    **prespec: int | bool,
) -> DraftSession:
    msg = pb.Open(
        protocol_version=PROTOCOL_VERSION,
        prompt_tokens=PROMPT,
        sampling=sampling_to_pb(params or SamplingParams()),
        k=K,
        vocab_fingerprint=draft.fingerprint,
        prespec=pb.PreSpeculation(enabled=True, fill=True, tree=True, fanout=2, **prespec),
    )
    session = DraftSession(draft, msg, WorkerCounters(), memory=memory)
    session.prefill()
    return session


def _greedy(model: LoadedModel, sequence: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(mx.argmax(model.model(mx.array([sequence + out]))[0, -1])))
    return out


@pytest.mark.parametrize(("batch", "passes"), [(1, 3), (3, 0), (8, 2), (8, 4)])
def test_each_round_is_answered_with_the_greedy_drafts_for_its_verdict(
    pair: tuple[LoadedModel, LoadedModel], batch: int, passes: int
) -> None:
    target, draft = pair
    session = _open(draft, batch=batch, budget=8)
    sent, context = session.first_drafts().block.tokens, list(PROMPT)
    for seq in range(1, ROUNDS + 1):
        drafts = sent + _greedy(draft, context + sent, K - len(sent))  # the coordinator fills the rest
        truth = _greedy(target, context, K + 1)
        accepted = next((i for i in range(K) if truth[i] != drafts[i]), K)
        appended = [*drafts[:accepted], truth[accepted]]
        for _ in range(passes):
            session.speculate()
        answer = session.answer_ready(
            pb.Round(seq=seq, accepted=accepted, token=appended[-1], k=K, appended=appended)
        )
        context += appended
        sent = list(answer.computed.block.tokens)
        assert sent == _greedy(draft, context, len(sent)), f"round {seq}"
        session.settle_ready(answer)
    assert session.hits + session.partial + session.misses == ROUNDS
    # The tree runs ahead: whole rounds are served. The hybrid pair agrees further (all 3 drafts in half
    # the rounds), so its verdicts land deeper than two passes reach.
    assert session.tree is not None
    if batch * passes >= 16 and (passes >= 4 or not session.tree.recurrent):
        assert session.hits > 0
    if passes == 0:  # nothing drafted ahead: every round is filled here, the tree re-rooted by a pass
        assert session.misses == ROUNDS


def test_a_tree_needs_fill_mode_no_windowed_layers_and_at_t_above_0_answers_trees_only(
    pair: tuple[LoadedModel, LoadedModel],
) -> None:
    sampled = _open(pair[1], SamplingParams(temperature=0.8, seed=1))
    first = sampled.first_drafts().block.tokens
    chain = pb.Round(seq=1, accepted=len(first), token=5, k=K, appended=[*first, 5])
    with pytest.raises(InvalidArgumentError, match="answers trees only"):
        sampled.answer_ready(chain)
    tree = sampled.answer_ready(pb.Round(**{**fields_of(chain), "tree_nodes": 8}))
    assert tree.computed.block.tree is None or len(tree.computed.block.tree) <= 8
    drafter = Drafter(pair[1].model, SamplingParams())
    drafter.cache[-1] = RotatingKVCache(8)
    with pytest.raises(InvalidArgumentError, match="windowed layers"):
        check_tree(drafter)
    with pytest.raises(InvalidArgumentError, match="it needs fill"):
        PrespecConfig(tree=True)


def test_a_hybrid_nodes_state_is_a_plain_pass_over_its_path_bit_for_bit() -> None:
    """Every node a tree expanded keeps each Gated DeltaNet layer's convolution window and recurrent
    state exactly as a plain pass over its path leaves them (on the CPU; a GPU within its rounding),
    and a verdict past the tree feeds it on from the right state."""
    _, draft = hybrid_pair()
    session = _open(draft, batch=5, budget=6)
    first = session.first_drafts().block.tokens
    session.plan_speculation()
    while session.speculate():
        pass
    tree = session.tree
    assert tree is not None and tree.recurrent and tree.held > 6
    table = tree.table
    expanded = [n for n in range(table.size) if table.slot[n] >= 0]
    assert len(expanded) == tree.held
    for node in expanded:
        _assert_state_of(
            draft, [*PROMPT[:-1], *_path(tree, node)], tree.arena.state_of(int(table.slot[node]))
        )
    appended = [*first[:1], (first[1] + 1) % 8, (first[1] + 2) % 8, 3]  # off the tree after one token
    session.settle_ready(session.answer_ready(pb.Round(seq=1, accepted=3, token=3, k=3, appended=appended)))
    assert tree.arena.prefix == len(PROMPT) + len(appended) - 1
    _assert_state_of(draft, [*PROMPT, *appended][:-1], tree.arena.prefix_states)


def _path(tree: DraftTree, node: int) -> list[int]:
    """The tokens from the tree's root to ``node``, both included."""
    table = tree.table
    path = []
    while node >= 0:
        path.append(int(table.token[node]))
        node = int(table.parent[node])
    return path[::-1]


def _assert_state_of(
    draft: LoadedModel, path: list[int], states: dict[int, tuple[mx.array, mx.array]]
) -> None:
    cache = make_prompt_cache(draft.model)
    draft.model(mx.array([path]), cache=cache)
    for layer, arrays in states.items():
        for got, want in zip(arrays, cache[layer].cache, strict=True):
            a, b = np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32))
            if mx.default_device() == mx.cpu:
                assert np.array_equal(a, b), f"layer {layer} after {path}"
            else:  # a GPU rounds a batch of rows apart from one row (tests/worker/stream/test_prespec.py)
                gap = float(np.abs(a - b).max())
                assert gap <= GPU_RTOL * float(np.abs(b).max()), f"layer {layer} after {path}: {gap}"


def test_hybrid_trees_share_the_workers_state_memory_and_stay_exact() -> None:
    """Two sessions' trees under one bound (ten planted nodes' states) hold no more than it between them,
    stop growing there, and the drafts each answers are still the draft's own greedy ones."""
    target, draft = hybrid_pair()
    memory = TreeMemory()
    sessions = [_open(draft, memory=memory, batch=4, budget=8) for _ in range(2)]
    for session in sessions:
        session.first_drafts()
    trees = [s.tree for s in sessions]
    assert trees[0] is not None and trees[1] is not None
    per_node = trees[0].node_bytes
    assert trees[0].state_bytes > 0 and memory.used == per_node * (trees[0].held + trees[1].held)
    memory.limit = 10 * per_node
    contexts = [list(PROMPT), list(PROMPT)]
    sent = [list(s.drafter.last_drafts) for s in sessions]
    full = 0
    for seq in range(1, 6):
        for i, session in enumerate(sessions):
            session.plan_speculation()
            while session.speculate():
                assert memory.used <= memory.limit
            full += (memory.free() or 0) < per_node
            drafts = sent[i] + _greedy(draft, contexts[i] + sent[i], K - len(sent[i]))
            truth = _greedy(target, contexts[i], K + 1)
            accepted = next((j for j in range(K) if truth[j] != drafts[j]), K)
            appended = [*drafts[:accepted], truth[accepted]]
            answer = session.answer_ready(
                pb.Round(seq=seq, accepted=accepted, token=appended[-1], k=K, appended=appended)
            )
            contexts[i] += appended
            sent[i] = list(answer.computed.block.tokens)
            assert sent[i] == _greedy(draft, contexts[i], len(sent[i])), f"session {i}, round {seq}"
            session.settle_ready(answer)
    assert full > 0  # the bound, not the budget, stopped the trees


def test_a_tree_that_names_no_batch_takes_the_workers_tree_rows() -> None:
    worker = PrespecConfig(batch=2, tree_rows=5)
    tree = pb.PreSpeculation(enabled=True, fill=True, tree=True)
    assert prespec_config(tree, worker).batch == 5
    tree.batch = 3
    assert prespec_config(tree, worker).batch == 3
    assert prespec_config(pb.PreSpeculation(enabled=True, fill=True), worker).batch == 2
    with pytest.raises(InvalidArgumentError, match="tree rows a pass must be within"):
        PrespecConfig(tree_rows=0)


def test_top_choices_are_the_likeliest_tokens_in_order() -> None:
    rows = mx.random.normal((4, 1000), key=mx.random.key(7)) * 4
    rows[1, 640] = rows[1, 3] = rows[1].max() + 1  # a tie across blocks: the lower id first, as argmax
    ids, probs = top_choices(rows, 5)
    host = np.array(rows)
    for i in range(4):
        assert np.array(ids[i]).tolist() == np.argsort(-host[i], kind="stable")[:5].tolist()
    assert int(np.array(ids)[1, 0]) == int(mx.argmax(rows[1])) == 3
    p = np.array(probs)
    assert np.all(np.diff(p, axis=1) <= 0) and np.all(p.sum(axis=1) <= 1 + 1e-6)


@pytest.mark.anyio
async def test_a_tree_it_cannot_draft_ends_only_its_session(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    tree = pb.PreSpeculation(enabled=True, fill=True, tree=True, batch=4)
    sampled = SamplingParams(temperature=0.8, seed=1)
    async with worker_channel(tiny_worker.address) as channel:
        good = channel.stream_stream(DRAFT_METHOD)(timeout=60)
        await good.write(open_request(tiny.fingerprint, [1, 2, 3], K, tree))
        assert pb.DraftReply.FromString(await good.read()).WhichOneof("kind") == "opened"
        first = pb.DraftReply.FromString(await good.read()).drafts
        bad_tree = pb.PreSpeculation(enabled=True, tree=True)
        for prespec, params, why in [
            (tree, sampled, "answers trees only"),
            (bad_tree, None, "it needs fill"),
        ]:
            bad = channel.stream_stream(DRAFT_METHOD)(timeout=60)
            await bad.write(open_request(tiny.fingerprint, [1, 2, 3], K, prespec, params))
            if params is not None:  # a sampled tree session opens; a chain round is what it refuses
                assert pb.DraftReply.FromString(await bad.read()).WhichOneof("kind") == "opened"
                drafts = pb.DraftReply.FromString(await bad.read()).drafts
                chain = pb.Round(seq=1, accepted=0, token=5, k=K, appended=[5])
                assert drafts.tokens
                await bad.write(pb.DraftRequest(round=chain).SerializeToString())
            with anyio.fail_after(30), pytest.raises(grpc.aio.AioRpcError) as err:
                await bad.read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert why in (err.value.details() or "")
        verdict = pb.Round(seq=1, accepted=K, token=5, k=K, appended=[*first.tokens, 5])
        await good.write(pb.DraftRequest(round=verdict).SerializeToString())
        reply = pb.DraftReply.FromString(await good.read()).drafts
        assert reply.seq == 1 and reply.counters.rounds == 2 and reply.HasField("speculation")
        await good.done_writing()


@pytest.mark.parametrize(("nodes", "depth"), [(1, 3), (6, 2), (40, 8)])
def test_a_round_that_asks_for_a_tree_gets_the_best_nodes_under_its_verdict(
    pair: tuple[LoadedModel, LoadedModel], nodes: int, depth: int
) -> None:
    """Every node is one of the draft's likeliest tokens after its own path, each after its parent,
    best first, no more and no deeper than asked; the draft's first choice leads."""
    _, draft = pair
    session = _open(draft, batch=4, budget=6)
    first = session.first_drafts().block.tokens
    session.plan_speculation()
    while session.speculate():
        pass
    appended = first[:2]  # the first draft accepted, then the draft's own second as the target's token
    verdict = pb.Round(seq=1, accepted=1, token=appended[-1], k=depth, appended=appended, tree_nodes=nodes)
    block = session.answer_ready(verdict).computed.block
    context = [*PROMPT, *appended]
    tree = block.tree
    assert tree is not None and 1 <= len(tree) <= nodes and tree.depth <= depth
    assert len(block.tree_probs) == len(tree)
    assert block.tree_probs == sorted(block.tree_probs, reverse=True)
    for i, token in enumerate(tree.tokens):
        path = [tree.tokens[j] for j in tree.path(i)][:-1]
        ids, _ = top_choices(draft.model(mx.array([context + path]))[0, -1:], 3)
        assert token in np.array(ids)[0].tolist(), f"node {i}"
    assert tree.tokens[0] == _greedy(draft, context, 1)[0]


@pytest.mark.anyio
async def test_a_tree_asked_of_a_session_that_cannot_grow_one_ends_only_that_session(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    fill = pb.PreSpeculation(enabled=True, fill=True)
    tree = pb.PreSpeculation(enabled=True, fill=True, tree=True, batch=4)
    async with worker_channel(tiny_worker.address) as channel:
        for prespec, nodes, why in [
            (None, 4, "needs a session that drafts a tree"),
            (fill, 4, "needs a session"),
            (tree, 100_000, "takes at most 256"),
        ]:
            call = channel.stream_stream(DRAFT_METHOD)(timeout=60)
            await call.write(open_request(tiny.fingerprint, [1, 2, 3], K, prespec))
            assert pb.DraftReply.FromString(await call.read()).WhichOneof("kind") == "opened"
            first = pb.DraftReply.FromString(await call.read()).drafts
            verdict = pb.Round(seq=1, accepted=K, token=5, k=K, appended=[*first.tokens, 5], tree_nodes=nodes)
            await call.write(pb.DraftRequest(round=verdict).SerializeToString())
            with anyio.fail_after(30), pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert why in (err.value.details() or "")
        healthy = channel.stream_stream(DRAFT_METHOD)(timeout=60)  # the worker serves on
        await healthy.write(open_request(tiny.fingerprint, [1, 2, 3], K, tree))
        assert pb.DraftReply.FromString(await healthy.read()).WhichOneof("kind") == "opened"
        first = pb.DraftReply.FromString(await healthy.read()).drafts
        verdict = pb.Round(seq=1, accepted=K, token=5, k=K, appended=[*first.tokens, 5], tree_nodes=8)
        await healthy.write(pb.DraftRequest(round=verdict).SerializeToString())
        reply = pb.DraftReply.FromString(await healthy.read()).drafts
        assert reply.seq == 1 and len(reply.parents) == len(reply.tokens) == len(reply.node_probs) <= 8
        await healthy.done_writing()
