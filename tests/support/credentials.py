"""The test session's shared token, as coordinators in this process use it."""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

import grpc

from coordinator.workers.credentials import Credentials
from specwire.wire.auth import AUTH_METADATA, TOKEN_ENV, caller_proof


def credentials() -> Credentials:
    """Credentials holding the session's token (set by tests/conftest.py)."""
    return Credentials(token=os.environ[TOKEN_ENV])


def channel(address: str) -> ProvingChannel:
    """A channel to a test worker that proves the session's token on every call."""
    return ProvingChannel(address, os.environ[TOKEN_ENV])


class ProvingChannel:
    """A grpc.aio channel whose calls each carry a fresh proof of the token.

    The proof goes in each call's metadata, as the coordinator sends it,
    rather than through an interceptor: an intercepted stream call feeds its
    writes through a task of its own, which stays pending after the stream
    fails and is reported, when collected, in whatever test runs then.
    """

    def __init__(self, address: str, token: str) -> None:
        self.token = token
        self._channel = grpc.aio.insecure_channel(address)

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> _Proving:
        return _Proving(self._channel.unary_unary(method, *args, **kwargs), method, self.token)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> _Proving:
        return _Proving(self._channel.stream_stream(method, *args, **kwargs), method, self.token)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> _Proving:
        return _Proving(self._channel.unary_stream(method, *args, **kwargs), method, self.token)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> _Proving:
        return _Proving(self._channel.stream_unary(method, *args, **kwargs), method, self.token)

    async def __aenter__(self) -> ProvingChannel:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._channel.close()


class _Proving:
    """A multi-callable that adds the proof for its method to every call."""

    def __init__(self, callable_: Any, method: str, token: str) -> None:
        self._callable = callable_
        self._method = method
        self._token = token

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        proof = (AUTH_METADATA, caller_proof(self._token, self._method))
        return self._callable(*args, metadata=[*(metadata or []), proof], **kwargs)
