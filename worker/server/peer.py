"""Whether a coordinator can use this worker at all: its protocol version and its vocabulary.

Both backends check this when a session opens (the stream protocol's ``Open``, the per-op executor's
``TensorOpen``), before anything touches the model."""

from __future__ import annotations

from specwire.errors import ProtocolVersionError, VocabularyMismatchError
from specwire.models.loading import LoadedModel
from specwire.wire.protocol import PROTOCOL_VERSION


def check_peer(model: LoadedModel, protocol_version: int, fingerprint: str) -> None:
    """Raise unless a coordinator with this protocol version and vocabulary can use this worker."""
    if protocol_version != PROTOCOL_VERSION:
        raise ProtocolVersionError(
            f"coordinator speaks protocol version {protocol_version}; this worker speaks {PROTOCOL_VERSION}"
        )
    if fingerprint != model.fingerprint:
        raise VocabularyMismatchError(
            f"coordinator vocabulary {fingerprint or '(none)'} does not match this worker's "
            f"{model.fingerprint} (model {model.spec}); draft and target must share one tokenizer"
        )
