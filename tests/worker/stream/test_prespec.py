"""Pre-speculation: branches drafted ahead are exactly the drafts on demand, and are served only on a hit.

The first tests drive the worker's session in-process on tiny models; the
last speak to a real ``worker serve`` subprocess of the tiny model for the
protocol (hits, misses, sampled drafts). Lossless output at T = 0 through a
worker of the default model: ``test_prespec_lossless.py``.
"""

from __future__ import annotations

import time

import anyio
import mlx.core as mx
import numpy as np
import pytest

import coordinator.decoding.acceptance as acceptance
from coordinator.decoding.engine import SpeculativeDecoder
from specwire.drafting.drafter import Drafter
from specwire.drafting.sampling import SamplingParams, target_distribution
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.v1 import draft_pb2_grpc
from specwire.wire.protocol import DRAFT_METHOD, PROTOCOL_VERSION, sampling_to_pb
from tests.coordinator.decoding.test_rejection_sampling import P_VALUE_FLOOR, chi_square_p, exact_joint
from tests.support.credentials import channel as worker_channel
from tests.support.messages import open_request, round_request
from tests.support.models.tiny_models import disagreeing_pair, hybrid_pair
from tests.support.processes.workers import WorkerProcess
from tests.support.prompts import PROMPTS
from tests.support.remote import generate_remote
from tests.support.rounding import first_divergence, rounding_gap, top2_gap
from tests.support.session_source import SessionSource
from worker.server.hosting import WorkerCounters
from worker.stream.session import DraftSession

PROMPT = [2, 5, 1]
PRESPEC = pb.PreSpeculation(enabled=True)
SAMPLED = {"temperature": 1.0, "draft_top_k": 8}
GPU_RTOL = 1e-2  # q's rounding on a GPU, with room: a branch drafted after the wrong prefix differs by O(1)
STAT_RUNS = 600  # the broken residual then fails at p ~ 1e-7 with half as many


@pytest.fixture(scope="module")
def pair() -> tuple[LoadedModel, LoadedModel]:
    """Tiny models that disagree: most runs reject the first draft, so a branch serves a later round."""
    return disagreeing_pair()


@pytest.fixture(scope="module")
def hybrids() -> tuple[LoadedModel, LoadedModel]:
    """A hybrid pair (Gated DeltaNet layers): branches roll the drafter's recurrent state back."""
    return hybrid_pair()


def _session(model: LoadedModel, params: SamplingParams, k: int, prespec: pb.PreSpeculation) -> DraftSession:
    msg = pb.Open(
        protocol_version=PROTOCOL_VERSION,
        prompt_tokens=PROMPT,
        sampling=sampling_to_pb(params),
        k=k,
        vocab_fingerprint=model.fingerprint,
        prespec=prespec,
    )
    session = DraftSession(model, msg, WorkerCounters())
    session.prefill()
    return session


@pytest.mark.parametrize("models", ["pair", "hybrids"])
@pytest.mark.parametrize("sampling", [{}, {**SAMPLED, "seed": 5}])
@pytest.mark.parametrize("batch", [1, 6])
def test_every_branch_equals_drafting_on_demand(
    request: pytest.FixtureRequest, models: str, sampling: dict, batch: int
) -> None:
    # batch 6: the pair's branches are drafted six to a pass; the hybrid drafter cannot batch its
    # recurrent state and drafts them one at a time.
    draft = request.getfixturevalue(models)[1]
    params = SamplingParams(**sampling)
    prespec = pb.PreSpeculation(enabled=True, budget=40, fanout=3, batch=batch)
    session = _session(draft, params, 3, prespec)
    sent = session.first_drafts().block.tokens
    session.plan_speculation()
    passes = 0
    while session.speculate():
        passes += 1
    assert session.speculator is not None
    branches = session.speculator.branches
    batched = batch > 1 and models == "pair"
    assert (passes < len(branches)) == batched, f"{passes} passes for {len(branches)} branches"
    assert any(a == 3 for a, _ in branches), "the bonus outcome is speculated"
    assert any(a < 3 for a, _ in branches), "rejection outcomes are speculated"
    for (accepted, token), branch in branches.items():
        assert branch.block is not None and branch.block.done
        reference = Drafter(draft.model, params)
        reference.start(PROMPT)
        assert reference.draft(3).tokens == sent
        reference.apply(accepted, token)
        expected = reference.draft(3)
        got = branch.block.block()
        # A branch reaches its prefix through other passes than drafting on demand does (batched,
        # or grouped otherwise): the same drafts and q bit for bit on the CPU. On a GPU the passes
        # round apart (an H100: 8e-4 relative in q for the llama pair, 1.4% for the hybrid), so
        # drafts may part only where the draft's two best logits tie within that rounding, and q
        # agrees within it. Exactness does not rest on it: each draft travels with the q it was
        # drawn from, and the verifier's rejection step uses that q.
        if mx.default_device() == mx.cpu:
            assert got.tokens == expected.tokens
            _assert_same_q(got.dists, expected.dists, 0.0)
            continue
        delta = rounding_gap(draft, branch.block.prefix + got.tokens[:-1], min(3, len(got.tokens)))
        at = first_divergence(got.tokens, expected.tokens)
        if at is not None:
            assert top2_gap(draft, branch.block.prefix + got.tokens[:at]) <= 2 * delta, (at, delta)
        upto = len(got.tokens) if at is None else at
        temperature = params.temperature or 1.0
        rtol = max(GPU_RTOL, float(np.exp(4 * delta / temperature) - 1))
        _assert_same_q(got.dists and got.dists[:upto], expected.dists and expected.dists[:upto], rtol)


def _assert_same_q(got: list | None, expected: list | None, rtol: float) -> None:
    if expected is None:
        return
    assert got is not None
    for a, b in zip(got, expected, strict=True):
        assert a.ids.tolist() == b.ids.tolist() or rtol > 0
        if a.ids.tolist() == b.ids.tolist():
            np.testing.assert_allclose(a.probs, b.probs, rtol=rtol)


def test_a_branch_is_served_only_for_its_own_verdict(pair: tuple[LoadedModel, LoadedModel]) -> None:
    session = _session(pair[1], SamplingParams(), 2, pb.PreSpeculation(enabled=True, budget=40, fanout=2))
    session.first_drafts()
    session.plan_speculation()
    while session.speculate():
        pass
    assert session.speculator is not None
    keys = set(session.speculator.branches)
    unknown = next((0, t) for t in range(8) if (0, t) not in keys and t != session.drafter.last_drafts[0])
    assert session.serve_hit(pb.Round(seq=1, accepted=unknown[0], token=unknown[1], k=2)) is None
    assert session.drafter.last_drafts, "a miss leaves the session untouched for drafting on demand"
    computed = session.round(pb.Round(seq=1, accepted=unknown[0], token=unknown[1], k=2))
    assert computed.outcome == pb.SPECULATION_MISS and session.misses == 1 and session.hits == 0


def _prespec_joint_counts(
    pair: tuple[LoadedModel, LoadedModel], runs: int, **sampling: float
) -> tuple[np.ndarray, list[int]]:
    target, draft = pair
    # Fan-out over the whole (tiny) vocabulary: every rejection round is then served by a hit,
    # from branches drafted side by side in batched passes.
    source = SessionSource(draft, pb.PreSpeculation(enabled=True, budget=16, fanout=7, batch=8))
    decoder = SpeculativeDecoder(target, source)
    vocab = target.vocab_size
    counts = np.zeros((vocab, vocab, vocab))
    for seed in range(runs):
        params = SamplingParams(seed=seed, **sampling)  # type: ignore[arg-type]
        tokens = decoder.generate(PROMPT, max_tokens=3, k=1, params=params).tokens
        counts[tokens[0], tokens[1], tokens[2]] += 1
    return counts, source.outcomes


def _exact_joint3(target: LoadedModel, params: SamplingParams) -> np.ndarray:
    """P(t1, t2, t3 | prompt) under the target's own sampling distribution."""

    def p_next(context: list[int]) -> np.ndarray:
        return target_distribution(np.array(target.model(mx.array([context]))[0, -1]), params)

    two = exact_joint(target, params)
    vocab = two.shape[0]
    return np.stack(
        [np.stack([two[a, b] * p_next([*PROMPT, a, b]) for b in range(vocab)]) for a in range(vocab)]
    )


def test_prespec_output_is_distributed_as_target(pair: tuple[LoadedModel, LoadedModel]) -> None:
    counts, outcomes = _prespec_joint_counts(pair, STAT_RUNS, **SAMPLED)
    # Every round after the first (one per run that rejected its first draft) came from a hit.
    assert len(outcomes) > STAT_RUNS // 2 and set(outcomes) == {pb.SPECULATION_HIT}
    assert chi_square_p(counts, _exact_joint3(pair[0], SamplingParams(**SAMPLED))) >= P_VALUE_FLOOR


def test_prespec_check_fails_when_residual_is_replaced_by_p(
    pair: tuple[LoadedModel, LoadedModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(acceptance, "residual_distribution", lambda p, q: p)
    counts, _ = _prespec_joint_counts(pair, STAT_RUNS // 2, **SAMPLED)
    assert chi_square_p(counts, _exact_joint3(pair[0], SamplingParams(**SAMPLED))) < P_VALUE_FLOOR


# Through real workers.


async def _counters(address: str) -> pb.WorkerCounters:
    async with worker_channel(address) as channel:
        reply = await draft_pb2_grpc.DraftWorkerStub(channel).Hello(pb.HelloRequest(), timeout=10)
        return reply.counters


@pytest.mark.anyio
async def test_forced_hit_is_served_from_the_cache_and_forced_miss_is_drafted(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    worker, k = tiny_worker, 2
    prompt = tiny.tokenizer.encode(PROMPTS[0])
    reference = Drafter(tiny.model, SamplingParams())
    reference.start(prompt)
    first = reference.draft(k).tokens
    bonus = int(reference.distribution_after(prompt + first, 1).ids[0])  # the most likely verdict
    reference.apply(k, bonus)
    after_hit = reference.draft(k).tokens
    likely = set(reference.distribution_after(prompt + first + [bonus], 16).ids.tolist())
    unlikely = next(t for t in range(1000, 2000) if t not in likely)
    reference.apply(0, unlikely)
    after_miss = reference.draft(k).tokens

    before = await _counters(worker.address)
    budget = 2 * k + 1  # the worker's default budget
    async with worker_channel(worker.address) as channel:
        call = channel.stream_stream(DRAFT_METHOD)(timeout=120)
        await call.write(open_request(tiny.fingerprint, prompt, k, PRESPEC))
        assert pb.DraftReply.FromString(await call.read()).WhichOneof("kind") == "opened"
        round0 = pb.DraftReply.FromString(await call.read()).drafts
        assert list(round0.tokens) == first
        with anyio.fail_after(120):  # let the worker spend its budget before the verdict
            while (await _counters(worker.address)).speculative_passes - before.speculative_passes < budget:
                await anyio.sleep(0.05)

        t0 = time.perf_counter()
        await call.write(round_request(1, k, bonus, k))
        hit = pb.DraftReply.FromString(await call.read()).drafts
        hit_s = time.perf_counter() - t0
        assert list(hit.tokens) == after_hit
        assert hit.speculation.outcome == pb.SPECULATION_HIT
        assert hit.timing.compute_ns == 0 and hit.speculation.saved_ns > 0
        assert hit.counters.prespec_hits == 1 and hit.counters.prespec_misses == 0

        await call.write(round_request(2, 0, unlikely, k))
        miss = pb.DraftReply.FromString(await call.read()).drafts
        assert list(miss.tokens) == after_miss
        assert miss.speculation.outcome == pb.SPECULATION_MISS
        assert miss.timing.compute_ns > 0
        assert miss.counters.prespec_hits == 1 and miss.counters.prespec_misses == 1
        await call.done_writing()
    after = await _counters(worker.address)
    assert after.prespec_hits - before.prespec_hits == 1
    assert after.prespec_misses - before.prespec_misses == 1
    print(f"hit answered in {hit_s * 1e3:.1f} ms; saved {hit.speculation.saved_ns / 1e6:.1f} ms of compute")


@pytest.mark.anyio
async def test_prespec_gives_the_same_sampled_tokens_as_drafting_on_demand(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    # A hit serves the very drafts (and randomness) that drafting on demand would give. At T = 0.3 the
    # tiny model's next token is among its eight likeliest often enough that some rounds hit. Each round
    # is followed by a pause, so the worker drafts ahead however busy the machine: without it, a loaded
    # make test left the worker one pass a round, always the bonus probe, and no round hit (20 of 20).
    params = SamplingParams(temperature=0.3, top_p=0.95, seed=7)
    prompt = tiny.tokenizer.encode(PROMPTS[4])
    (plain,) = await generate_remote(tiny_worker.address, tiny, [prompt], 2, 64, params)
    for batch in (1, 8):  # one branch a pass, and eight side by side (a hit takes its row's cache)
        wide = pb.PreSpeculation(enabled=True, budget=40, fanout=8, batch=batch)
        (ahead,) = await generate_remote(tiny_worker.address, tiny, [prompt], 2, 64, params, wide, 0.1)
        assert ahead.result.tokens == plain.result.tokens
        assert [r.draft.tokens for r in ahead.result.rounds] == [r.draft.tokens for r in plain.result.rounds]
        used = ahead.worker_counters.prespec_hits + ahead.worker_counters.prespec_partial
        assert used > 0, ahead.worker_counters


@pytest.mark.parametrize(
    ("prespec", "message"),
    [
        (pb.PreSpeculation(enabled=True, budget=100_000), "budget must be within"),
        (pb.PreSpeculation(enabled=True, fanout=99), "fan-out must be within"),
        (pb.PreSpeculation(enabled=True, batch=65), "batch must be within"),
    ],
)
def test_bad_prespec_options_are_refused_with_a_clear_message(
    pair: tuple[LoadedModel, LoadedModel], prespec: pb.PreSpeculation, message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        _session(pair[1], SamplingParams(), 2, prespec)


def test_appended_tokens_must_match_the_verdict(pair: tuple[LoadedModel, LoadedModel]) -> None:
    session = _session(pair[1], SamplingParams(), 2, PRESPEC)
    session.first_drafts()
    with pytest.raises(InvalidArgumentError, match="appended must hold"):
        session.check_round(pb.Round(seq=1, accepted=1, token=3, k=2, appended=[5, 4]))
    session.check_round(pb.Round(seq=1, accepted=1, token=3, k=2, appended=[5, 3]))
