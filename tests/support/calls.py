"""Raw calls to a worker over gRPC, for tests that check what it answers below the draft-source layer."""

from __future__ import annotations

import grpc
import pytest

from specwire.v1 import draft_pb2 as pb
from specwire.v1 import draft_pb2_grpc
from tests.support.credentials import channel as worker_channel


async def refusal(address: str, method: str, *messages: bytes) -> grpc.aio.AioRpcError:
    """The error a streaming ``method`` ends with after ``messages`` (the test fails if it ends well)."""
    async with worker_channel(address) as channel:
        call = channel.stream_stream(method)(timeout=60)
        for m in messages:
            await call.write(m)
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                pass
            raise grpc.aio.AioRpcError(await call.code(), None, None, await call.details())
        return err.value


async def hello(address: str) -> pb.HelloReply:
    """The worker's Hello."""
    async with worker_channel(address) as channel:
        return await draft_pb2_grpc.DraftWorkerStub(channel).Hello(pb.HelloRequest(), timeout=10)
