"""Generating through a real worker from inside a test process."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from coordinator.decoding.engine import GenerationResult, SpeculativeDecoder
from coordinator.drafting.ggml_rpc.source import PerOpDraftSource
from coordinator.drafting.stream import StreamDraftSource
from coordinator.runtime import coordinator_runtime
from coordinator.workers.connection import connect, refresh_hello
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from tests.support.credentials import credentials


@dataclass
class RemoteRun:
    """One generation through a worker, with both sides' message counts."""

    result: GenerationResult
    client_sent: int
    client_received: int
    worker_counters: pb.SessionCounters
    hello: pb.HelloReply


async def generate_remote(
    address: str,
    target: LoadedModel,
    prompts: list[list[int]],
    k: int,
    max_tokens: int,
    params: SamplingParams,
    prespec: pb.PreSpeculation | None = None,
    round_pause_s: float = 0.0,
) -> list[RemoteRun]:
    """Run each prompt through the stream backend of the worker at ``address``; ``round_pause_s`` after
    each round (the worker drafts ahead meanwhile, however busy the machine)."""
    runs = []
    async with coordinator_runtime() as runtime:
        connection = await connect(address, credentials())
        try:
            source = StreamDraftSource(runtime.portal, connection, target.fingerprint, prespec=prespec)
            decoder = SpeculativeDecoder(target, source)
            for prompt in prompts:
                result = await runtime.compute.run(
                    functools.partial(decoder.generate, on_tokens=_pause(round_pause_s)),
                    prompt,
                    max_tokens=max_tokens,
                    k=k,
                    params=params,
                )
                runs.append(
                    RemoteRun(result, source.sent, source.received, source.worker_counters, connection.hello)
                )
        finally:
            await connection.close()
    return runs


async def generate_per_op(
    address: str,
    target: LoadedModel,
    prompts: list[list[int]],
    k: int,
    max_tokens: int,
    params: SamplingParams,
    granularity: str,
) -> list[PerOpRun]:
    """Run each prompt through the per-op backend of the worker at ``address``."""
    runs = []
    async with coordinator_runtime() as runtime:
        connection = await connect(address, credentials())
        try:
            source = PerOpDraftSource(runtime.portal, connection, target.fingerprint, granularity)
            decoder = SpeculativeDecoder(target, source)
            for prompt in prompts:
                result = await runtime.compute.run(
                    decoder.generate, prompt, max_tokens=max_tokens, k=k, params=params
                )
                assert source.client is not None
                client = source.client
                runs.append(
                    PerOpRun(result, client.calls, client.ops, source.prefill_calls, client.worker_counters)
                )
        finally:
            await connection.close()
    return runs


@dataclass
class PerOpRun:
    """One generation through the per-op backend, with both sides' counts."""

    result: GenerationResult
    client_calls: int
    client_ops: int
    prefill_calls: int
    worker_counters: pb.TensorCounters


async def assert_per_op_drafts_as_stream(
    address: str, target: LoadedModel, prompt: list[int], k: int, max_tokens: int, params: SamplingParams
) -> None:
    """The per-op backend (token granularity) drafts, round for round, what the stream backend drafts."""
    (per_op,) = await generate_per_op(address, target, [prompt], k, max_tokens, params, "token")
    (stream,) = await generate_remote(address, target, [prompt], k, max_tokens, params)
    assert per_op.result.tokens == stream.result.tokens
    assert [r.draft.tokens for r in per_op.result.rounds] == [r.draft.tokens for r in stream.result.rounds]


def _pause(seconds: float) -> Callable[[list[int]], None] | None:
    """An ``on_tokens`` that sleeps ``seconds`` after each round (None: no pause)."""
    if seconds <= 0:
        return None
    return lambda tokens: time.sleep(seconds)


async def sessions_active(address: str) -> int:
    """The sessions the worker at ``address`` has open now (its Hello's counters)."""
    connection = await connect(address, credentials())
    try:
        return int((await refresh_hello(connection)).counters.sessions_active)
    finally:
        await connection.close()


async def sessions_drained(address: str, timeout_s: float = 30.0) -> None:
    """Wait until the worker at ``address`` has no session open (a closed one ends as the worker sees it)."""
    with anyio.fail_after(timeout_s):
        while await sessions_active(address) != 0:
            await anyio.sleep(0.05)
