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
