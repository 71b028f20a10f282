"""A connection to a worker: a gRPC channel, and the worker's Hello.

Connecting calls Hello, so every connection starts with the worker's
identity in hand, and checks the worker's proof of the shared token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
import msgpack

from coordinator.workers.credentials import Credentials
from coordinator.workers.errors import remote_error
from specwire.errors import AuthenticationError
from specwire.v1 import draft_pb2 as pb
from specwire.v1 import draft_pb2_grpc
from specwire.wire.auth import AUTH_METADATA, caller_proof, check_worker_proof
from specwire.wire.protocol import HELLO_METHOD

HELLO_TIMEOUT_S = 10.0


@dataclass
class WorkerConnection:
    """An open channel to a worker, and what the worker said about itself."""

    address: str
    channel: grpc.aio.Channel
    hello: pb.HelloReply
    credentials: Credentials

    @property
    def name(self) -> str:
        """The worker's instance name."""
        return self.hello.identity.name or self.address

    def model_config(self) -> dict[str, Any]:
        """The draft model's structure, as the worker's Hello sent it."""
        return (
            dict(msgpack.unpackb(self.hello.model.config_msgpack)) if self.hello.model.config_msgpack else {}
        )

    def identity(self) -> dict[str, Any]:
        """Name, label, host, pid and boot id: the proof of which process drafted."""
        ident = self.hello.identity
        return {
            "name": ident.name,
            "label": ident.label,
            "host": ident.host,
            "pid": ident.pid,
            "boot_id": ident.boot_id,
            "address": self.address,
        }

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()


async def connect(
    address: str, credentials: Credentials, timeout: float = HELLO_TIMEOUT_S
) -> WorkerConnection:
    """Open a channel to ``address``, call Hello, and check the worker holds the shared token."""
    channel = credentials.channel(address)
    proof = caller_proof(credentials.token, HELLO_METHOD) if credentials.token else ""
    metadata = [(AUTH_METADATA, proof)] if proof else None
    try:
        hello = await draft_pb2_grpc.DraftWorkerStub(channel).Hello(
            pb.HelloRequest(), timeout=timeout, metadata=metadata
        )
    except grpc.RpcError as err:
        await channel.close()
        raise remote_error(err, address, "saying hello") from err
    try:
        _check_worker_proof(address, hello, credentials, proof)
    except AuthenticationError:
        await channel.close()
        raise
    return WorkerConnection(address, channel, hello, credentials)


def _check_worker_proof(address: str, hello: pb.HelloReply, credentials: Credentials, proof: str) -> None:
    name = hello.identity.name or address
    if credentials.token is None:
        return
    if not hello.auth_proof:
        raise AuthenticationError(
            f"worker {name} at {address} does not use the shared token (it runs --insecure); "
            "not used: pass --insecure to allow it"
        )
    if not check_worker_proof(credentials.token, proof, hello.auth_proof):
        raise AuthenticationError(
            f"worker {name} at {address} could not prove it holds the shared token "
            "(a spoofed advertisement, or another token); not used"
        )


async def refresh_hello(connection: WorkerConnection, timeout: float = HELLO_TIMEOUT_S) -> pb.HelloReply:
    """Ask the worker for its Hello again (fresh counters and memory figures)."""
    try:
        hello = await draft_pb2_grpc.DraftWorkerStub(connection.channel).Hello(
            pb.HelloRequest(), timeout=timeout, metadata=connection.credentials.metadata(HELLO_METHOD)
        )
    except grpc.RpcError as err:
        raise remote_error(err, connection.name, "saying hello") from err
    connection.hello = hello
    return hello
