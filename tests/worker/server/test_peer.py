"""A coordinator of another protocol version or vocabulary is refused when its session opens, on both
backends, with FAILED_PRECONDITION naming both sides, and the worker stays up (``worker.server.peer``)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import DRAFT_METHOD, EXECUTE_METHOD, PROTOCOL_VERSION
from tests.support.calls import hello, refusal
from tests.support.messages import open_request
from tests.support.processes.workers import WorkerProcess

pytestmark = pytest.mark.anyio

BAD_FP = "v1:0000000000000000"
Opening = Callable[[int, str], bytes]


def _tensor_open(version: int, fingerprint: str) -> bytes:
    return pb.TensorRequest(
        open=pb.TensorOpen(protocol_version=version, vocab_fingerprint=fingerprint)
    ).SerializeToString()


def _stream_open(version: int, fingerprint: str) -> bytes:
    request = pb.DraftRequest.FromString(open_request(fingerprint))
    request.open.protocol_version = version
    return request.SerializeToString()


# Each backend's method and its opening message for a protocol version and a fingerprint.
BACKENDS = [(DRAFT_METHOD, _stream_open), (EXECUTE_METHOD, _tensor_open)]


@pytest.mark.parametrize(("method", "opening"), BACKENDS, ids=["stream", "per-op"])
async def test_a_vocabulary_mismatch_is_refused_and_the_worker_stays_up(
    tiny_worker: WorkerProcess, method: str, opening: Opening
) -> None:
    greeting = await hello(tiny_worker.address)
    err = await refusal(tiny_worker.address, method, opening(PROTOCOL_VERSION, BAD_FP))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert BAD_FP in (err.details() or "") and greeting.model.fingerprint in (err.details() or "")
    after = await hello(tiny_worker.address)
    assert after.identity.boot_id == greeting.identity.boot_id


@pytest.mark.parametrize(("method", "opening"), BACKENDS, ids=["stream", "per-op"])
async def test_another_protocol_version_is_refused(
    tiny_worker: WorkerProcess, tiny: LoadedModel, method: str, opening: Opening
) -> None:
    err = await refusal(tiny_worker.address, method, opening(PROTOCOL_VERSION + 1, tiny.fingerprint))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"protocol version {PROTOCOL_VERSION + 1}" in (err.details() or "")
