"""The stream protocol against real ``worker serve`` subprocesses.

Lossless drafting is checked on the real default model; the protocol's
exactness, refusals and health on the tiny model (same tokenizer, fast).
"""

from __future__ import annotations

import time

import anyio
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.local import LocalDraftSource
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import DRAFT_METHOD, PROTOCOL_VERSION
from tests.support.calls import hello, refusal
from tests.support.credentials import channel as worker_channel
from tests.support.messages import open_request, round_request
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name
from tests.support.prompts import MAX_TOKENS, PROMPTS, ar_tokens, local_sd
from tests.support.remote import generate_remote

pytestmark = pytest.mark.anyio


def check_message_counts(run) -> None:  # type: ignore[no-untyped-def]
    """One message each way per round, counted by both ends."""
    rounds = sum(1 for r in run.result.rounds if r.draft.calls)  # rounds that asked the worker
    assert run.worker_counters.rounds == rounds
    # Requests: the Open (which asks for round 0) and one Round per later round.
    assert run.client_sent == rounds == run.worker_counters.messages_received
    # Replies: Opened, then one Drafts per round; the worker counts what it sent before the last.
    assert run.client_received == rounds + 1 == run.worker_counters.messages_sent + 1


async def test_remote_drafting_is_lossless_and_matches_local(
    worker: WorkerProcess, default_f32: LoadedModel, default_q4: LoadedModel
) -> None:
    prompts = [default_f32.tokenizer.encode(PROMPTS[4])]  # prose (code and math go remote in other tests)
    runs = await generate_remote(worker.address, default_f32, prompts, 4, MAX_TOKENS, SamplingParams())
    for prompt, run in zip(prompts, runs, strict=True):
        expected = local_sd(default_f32, default_q4, prompt, 4)  # test_lossless's run of this prompt
        assert run.result.tokens == ar_tokens(default_f32, prompt) == expected.tokens
        assert [r.accepted for r in run.result.rounds] == [r.accepted for r in expected.rounds]
        assert [r.draft.tokens for r in run.result.rounds] == [r.draft.tokens for r in expected.rounds]
        check_message_counts(run)
        assert all(len(r.draft.calls) == 1 for r in run.result.rounds)
    assert runs[0].hello.identity.pid == worker.pid


async def test_sampled_drafts_travel_exactly(tiny_worker: WorkerProcess, tiny: LoadedModel) -> None:
    # Same seed, same draft model: the worker's sampled drafts and their sparse
    # q must equal local drafting's, so the rejection sampling sees the same numbers.
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=11)
    prompt = tiny.tokenizer.encode(PROMPTS[4])
    (run,) = await generate_remote(tiny_worker.address, tiny, [prompt], 3, 24, params)
    local = SpeculativeDecoder(tiny, LocalDraftSource(tiny)).generate(
        prompt, max_tokens=24, k=3, params=params
    )
    assert run.result.tokens == local.tokens
    for remote_round, local_round in zip(run.result.rounds, local.rounds, strict=True):
        assert remote_round.draft.tokens == local_round.draft.tokens
        if not local_round.draft.tokens:  # the last round may draft nothing
            assert remote_round.draft.dists is None and local_round.draft.dists is None
            continue
        assert remote_round.draft.dists is not None and local_round.draft.dists is not None
        for a, b in zip(remote_round.draft.dists, local_round.draft.dists, strict=True):
            assert a.ids.tolist() == b.ids.tolist() and a.probs.tolist() == b.probs.tolist()
    check_message_counts(run)


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([b"\xff\xff\xff"], "malformed DraftRequest"),
        (
            [pb.DraftRequest(round=pb.Round(seq=0, k=1)).SerializeToString()],
            "first message of a session must be Open",
        ),
        ("bad-round", "out of order"),
        ("huge-token", "outside the vocabulary"),
        ("big-k", "outside 1..32"),
        (pb.LogitsProcessing(grammar="start: nonsense", grammar_source="response_format"), "response_format"),
        (pb.LogitsProcessing(logit_bias={10**6: 1.0}), "logit_bias names token 1000000"),
        (pb.LogitsProcessing(presence_penalty=0.5, output_tokens=9), "output_tokens 9 exceeds"),
    ],
)
async def test_bad_messages_get_invalid_argument(
    tiny_worker: WorkerProcess, tiny: LoadedModel, messages, fragment
) -> None:  # type: ignore[no-untyped-def]
    fp = tiny.fingerprint
    if messages == "bad-round":
        messages = [
            open_request(fp),
            round_request(5, 0, 1, 1),
        ]
    elif messages == "huge-token":
        messages = [open_request(fp, [1, 10**6])]
    elif messages == "big-k":
        messages = [open_request(fp, k=40)]
    elif isinstance(messages, pb.LogitsProcessing):  # the request's penalties and grammar, checked
        messages = [open_request(fp, processing=messages)]
    err = await refusal(tiny_worker.address, DRAFT_METHOD, *messages)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in err.details()
    assert (await hello(tiny_worker.address)).protocol_version == PROTOCOL_VERSION


async def test_health_service_reports_serving(tiny_worker: WorkerProcess) -> None:
    async with worker_channel(tiny_worker.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "specwire.v1.DraftWorker"):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


IDLE_TIMEOUT_S = 2.0


async def test_a_silent_session_is_freed_after_the_idle_timeout(tiny: LoadedModel) -> None:
    name = unique_name("idle-worker")
    with running_worker("--model", "tiny", "--name", name, "--idle-timeout", str(IDLE_TIMEOUT_S)) as worker:
        async with worker_channel(worker.address) as channel:
            call = channel.stream_stream(DRAFT_METHOD)(timeout=60)
            await call.write(open_request(tiny.fingerprint))
            t0 = time.monotonic()
            replies = 0
            with pytest.raises(grpc.aio.AioRpcError) as err, anyio.fail_after(30):
                async for _ in call:  # Opened, round 0's Drafts, then silence until the worker ends it
                    replies += 1
            assert replies == 2 and time.monotonic() - t0 >= IDLE_TIMEOUT_S * 0.9
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "idle" in (err.value.details() or "")
        greeting = await hello(worker.address)
        assert greeting.counters.sessions_active == 0 and greeting.counters.sessions_opened == 1
