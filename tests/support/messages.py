"""Raw protocol messages for tests that speak to a worker below the draft-source layer."""

from __future__ import annotations

import contextlib
from typing import Any

import grpc
from google.protobuf.message import Message

from specwire.drafting.sampling import SamplingParams
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import DRAFT_METHOD, PROTOCOL_VERSION, sampling_to_pb


def open_request(
    fingerprint: str,
    prompt: list[int] | None = None,
    k: int = 2,
    prespec: pb.PreSpeculation | None = None,
    params: SamplingParams | None = None,
    processing: pb.LogitsProcessing | None = None,
) -> bytes:
    """An encoded Open message (greedy sampling unless ``params`` say otherwise)."""
    return pb.DraftRequest(
        open=pb.Open(
            protocol_version=PROTOCOL_VERSION,
            prompt_tokens=prompt or [1, 2, 3],
            sampling=sampling_to_pb(params or SamplingParams()),
            k=k,
            vocab_fingerprint=fingerprint,
            prespec=prespec,
            processing=processing,
        )
    ).SerializeToString()


def round_request(seq: int, accepted: int, token: int, k: int) -> bytes:
    """An encoded Round message."""
    return pb.DraftRequest(round=pb.Round(seq=seq, accepted=accepted, token=token, k=k)).SerializeToString()


def fields_of(msg: Message) -> dict:
    """The fields ``msg`` sets, by name: to build a variant of it with a field changed."""
    return {f.name: getattr(msg, f.name) for f, _ in msg.ListFields()}


async def refused_open(channel: Any, fingerprint: str, timeout: float = 10.0) -> tuple[grpc.StatusCode, str]:
    """Open a session on ``channel`` expecting the worker to refuse it: the call's status and details."""
    call = channel.stream_stream(DRAFT_METHOD)(timeout=timeout)
    with contextlib.suppress(grpc.aio.AioRpcError):  # the refusal may end the call mid-write
        await call.write(open_request(fingerprint))
    return await call.code(), await call.details()
