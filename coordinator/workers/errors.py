"""The one place where the coordinator turns gRPC failures into clear messages."""

from __future__ import annotations

import grpc

from specwire.errors import RemoteWorkerError
from specwire.wire.auth import TOKEN_ENV, default_token_path

_REFUSALS = {
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
}


def remote_error(err: grpc.RpcError, worker: str, action: str) -> RemoteWorkerError:
    """A ``RemoteWorkerError`` saying what failed, where, and why."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or "no details"
    if code == grpc.StatusCode.UNAVAILABLE:
        message = f"worker {worker} is unreachable or went away while {action} ({details})"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        message = f"worker {worker} did not answer in time while {action}"
    elif code == grpc.StatusCode.UNAUTHENTICATED:
        message = (
            f"worker {worker} refused {action} ({details}): it holds another token than this machine's "
            f"({default_token_path()}, or --token-file or ${TOKEN_ENV}); on the worker's machine run "
            "`worker token set TOKEN` with the token `coordinator token show` prints here, and restart it"
        )
    elif code in _REFUSALS:
        message = f"worker {worker} refused {action} ({code.name}): {details}"
    else:
        message = f"worker {worker} failed while {action} ({code.name}): {details}"
    return RemoteWorkerError(message, code.name)


def timeout_error(worker: str, action: str, seconds: float) -> RemoteWorkerError:
    """The error for a worker that stopped answering within the client's deadline."""
    return RemoteWorkerError(
        f"worker {worker} did not answer within {seconds:g} s while {action}", "DEADLINE_EXCEEDED"
    )
