"""Domain errors, one module for all of them.

Every error here carries a one-line message a user can act on. The command
lines print ``error: <message>`` and exit non-zero; the worker maps these to
gRPC status codes in one place. Nothing else in specwire should raise a bare
``ValueError`` for bad input.
"""

from __future__ import annotations


class SpecwireError(Exception):
    """Base class of every error a user can act on; ``str(err)`` is one line."""


class ModelNotFoundError(SpecwireError):
    """A model spec names nothing that exists: a missing file or directory, or an unknown id."""


class UnsupportedModelError(SpecwireError):
    """The model is readable, but its architecture, tensor type or tokenizer is not supported."""


class ModelFormatError(SpecwireError):
    """A model file is damaged or is not in the format its name claims."""


class VocabularyMismatchError(SpecwireError):
    """Two models, or a coordinator and a worker, do not share one vocabulary."""


class InvalidArgumentError(SpecwireError):
    """A request or option is out of range or malformed."""


class ProtocolVersionError(SpecwireError):
    """Coordinator and worker speak different versions of the specwire protocol."""


class AuthenticationError(SpecwireError):
    """A caller or a worker could not prove it holds the shared token, or the token is unusable."""


class BackendUnavailableError(SpecwireError):
    """A worker does not offer the drafting backend that was asked for."""


class CapacityError(SpecwireError):
    """A worker has no free session slot."""


class SessionIdleError(SpecwireError):
    """A session sent nothing for longer than the worker's idle timeout, and was freed."""


class WorkerFault(SpecwireError):
    """A worker hit an unexpected fault while serving a session (a bug; the worker goes on)."""


class NoWorkerError(SpecwireError):
    """Discovery found no worker that can draft for this target."""


class BonjourUnavailableError(SpecwireError):
    """mDNS cannot be used on the interfaces asked for (none up, or multicast refused)."""


class RemoteWorkerError(SpecwireError):
    """A worker refused a request, failed, or could not be reached.

    ``code`` is the gRPC status code name (such as ``"UNAVAILABLE"``), so
    callers can tell a dead worker from a refused request.
    """

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


class BenchFailure(SpecwireError):
    """A bench ran, but a result is invalid: an output differs from AR, or remote work is unproven."""


class UnknownModelError(SpecwireError):
    """A request names a model this server does not serve."""


class ContextLengthError(InvalidArgumentError):
    """A prompt, with the tokens asked for after it, does not fit the target's context."""


class UnsupportedParameterError(InvalidArgumentError):
    """A request sets a parameter this server does not implement; ``param`` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class BodyTooLargeError(SpecwireError):
    """A request body is larger than ``coordinator serve --max-body`` allows."""


class QueueFullError(SpecwireError):
    """The server's request queue is full; ``retry_after_s`` is when a slot is likely free."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ApiKeyError(AuthenticationError):
    """A client of ``coordinator serve`` sent no API key, or the wrong one."""
