"""Authentication on the worker: every call to specwire's services must prove the shared token.

One server interceptor checks the ``x-specwire-auth`` proof of every call to
the DraftWorker and TensorWorker services (both backends, the echoes, and
Hello) and answers UNAUTHENTICATED, with the reason, when it is missing,
wrong, stale or replayed. The standard health and reflection services stay
open: they reveal no model state. The raw TCP echo port checks the same
proof in its first frame.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from specwire.errors import AuthenticationError
from specwire.wire.auth import AUTH_METADATA, ProofChecker

log = logging.getLogger(__name__)
PROTECTED_PREFIX = "/specwire.v1."


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that ends the call with UNAUTHENTICATED."""

    async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **serializers)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **serializers)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **serializers)
    return grpc.unary_unary_rpc_method_handler(deny, **serializers)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls to specwire's services without a valid proof of the token."""

    def __init__(self, checker: ProofChecker) -> None:
        self.checker = checker

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(PROTECTED_PREFIX):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        try:
            self.checker.check(metadata.get(AUTH_METADATA), method)
        except AuthenticationError as err:
            log.info("refused %s: %s", method, err)
            return _refusal(handler, f"unauthenticated: {err}")
        return handler


def caller_proof_of(context: grpc.aio.ServicerContext) -> str:
    """The caller's proof, as it came in the call's metadata."""
    return str(dict(context.invocation_metadata() or ()).get(AUTH_METADATA, ""))
