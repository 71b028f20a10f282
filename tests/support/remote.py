"""Generating through a real worker from inside a test process."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.drafting.stream import StreamDraftSource
from coordinator.engine import GenerationResult, SpeculativeDecoder
from coordinator.runtime import coordinator_runtime
from coordinator.workers import connect
from specwire.models import LoadedModel
from specwire.sampling import SamplingParams
from specwire.v1 import draft_pb2 as pb


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
) -> list[RemoteRun]:
    """Run each prompt through the stream backend of the worker at ``address``."""
    runs = []
    async with coordinator_runtime() as runtime:
        connection = await connect(address)
        try:
            source = StreamDraftSource(runtime.portal, connection, target.fingerprint)
            decoder = SpeculativeDecoder(target, source)
            for prompt in prompts:
                result = await runtime.compute.run(
                    decoder.generate, prompt, max_tokens=max_tokens, k=k, params=params
                )
                runs.append(
                    RemoteRun(result, source.sent, source.received, source.worker_counters, connection.hello)
                )
        finally:
            await connection.close()
    return runs
