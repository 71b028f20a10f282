"""The one place where the worker turns domain errors into gRPC status codes."""

from __future__ import annotations

import grpc

from specwire.errors import (
    AuthenticationError,
    BackendUnavailableError,
    CapacityError,
    InvalidArgumentError,
    ProtocolVersionError,
    SessionIdleError,
    SpecwireError,
    UnsupportedModelError,
    VocabularyMismatchError,
)

_CODES: list[tuple[type[SpecwireError], grpc.StatusCode]] = [
    (VocabularyMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (ProtocolVersionError, grpc.StatusCode.FAILED_PRECONDITION),
    (UnsupportedModelError, grpc.StatusCode.FAILED_PRECONDITION),
    (BackendUnavailableError, grpc.StatusCode.FAILED_PRECONDITION),
    (CapacityError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (AuthenticationError, grpc.StatusCode.UNAUTHENTICATED),
    (SessionIdleError, grpc.StatusCode.DEADLINE_EXCEEDED),
]


def status_for(err: SpecwireError) -> grpc.StatusCode:
    """The gRPC status code a coordinator sees for ``err``."""
    for kind, code in _CODES:
        if isinstance(err, kind):
            return code
    return grpc.StatusCode.INTERNAL
