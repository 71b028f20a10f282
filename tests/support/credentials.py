"""The test session's shared token, as coordinators in this process use it."""

from __future__ import annotations

import os
from typing import Any

import grpc

from coordinator.credentials import Credentials
from specwire.auth import AUTH_METADATA, TOKEN_ENV, caller_proof


def credentials() -> Credentials:
    """Credentials holding the session's token (set by tests/conftest.py)."""
    return Credentials(token=os.environ[TOKEN_ENV])


def channel(address: str) -> grpc.aio.Channel:
    """A channel to a test worker that proves the session's token on every call."""
    return grpc.aio.insecure_channel(address, interceptors=_proof_interceptors(os.environ[TOKEN_ENV]))


class _Proof:
    def __init__(self, token: str) -> None:
        self.token = token

    def details(self, details: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        extra = (AUTH_METADATA, caller_proof(self.token, method))
        md = grpc.aio.Metadata(*list(details.metadata or []), extra)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, md, details.credentials, details.wait_for_ready
        )


class _UnaryUnary(_Proof, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self.details(details), request)


class _StreamStream(_Proof, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(self.details(details), request_iterator)


def _proof_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """Raw test channels prove the token through interceptors (gRPC sorts them by call shape)."""
    return [_UnaryUnary(token), _StreamStream(token)]
