"""What a worker checks before a session touches its model: the peer, the Open message, each token
and k, and the pre-speculation settings a session asks for."""

from __future__ import annotations

from specwire.drafting.draft_tree import tree_batchable
from specwire.drafting.drafter import Drafter
from specwire.drafting.speculation import PrespecConfig
from specwire.errors import InvalidArgumentError, ProtocolVersionError, VocabularyMismatchError
from specwire.models import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import MAX_K, PROTOCOL_VERSION, sampling_from_pb


def prespec_config(msg: pb.PreSpeculation, defaults: PrespecConfig) -> PrespecConfig | None:
    """The session's pre-speculation settings: the Open message's, over the worker's defaults (for a tree
    that names no batch, the worker's tree rows)."""
    if not msg.enabled:
        return None
    return PrespecConfig(
        budget=msg.budget or defaults.budget,
        fanout=msg.fanout or defaults.fanout,
        batch=msg.batch or (defaults.tree_rows if msg.tree else defaults.batch),
        fill=msg.fill,
        tree=msg.tree,
        tree_rows=defaults.tree_rows,
        tree_memory=defaults.tree_memory,
    )


def check_tree(drafter: Drafter) -> None:
    """Raise unless tree pre-speculation can draft for ``drafter``: over KV caches and recurrent states
    (``tree_batchable``). At T > 0 its rounds must ask for trees (``DraftSession.check_round``)."""
    if not tree_batchable(drafter.cache):
        raise InvalidArgumentError(
            "tree pre-speculation batches rows of KV caches and recurrent states: this draft model has "
            "windowed layers"
        )


def check_k(k: int) -> None:
    """Raise unless ``k`` is a draft count the protocol allows (1..MAX_K)."""
    if not 1 <= k <= MAX_K:
        raise InvalidArgumentError(f"k={k} is outside 1..{MAX_K}")


def check_token(model: LoadedModel, token: int, what: str) -> None:
    """Raise unless ``token`` is an id of the model's vocabulary."""
    if token >= model.vocab_size:
        raise InvalidArgumentError(f"{what} {token} is outside the vocabulary (size {model.vocab_size})")


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


def check_open(model: LoadedModel, msg: pb.Open) -> None:
    """Raise the precise error for an Open message this worker cannot serve."""
    check_peer(model, msg.protocol_version, msg.vocab_fingerprint)
    if not msg.prompt_tokens:
        raise InvalidArgumentError("the prompt must hold at least one token")
    if len(msg.prompt_tokens) + msg.k >= model.context_length:
        raise InvalidArgumentError(
            f"a prompt of {len(msg.prompt_tokens)} tokens plus k={msg.k} does not fit the "
            f"model's context of {model.context_length}"
        )
    bad = max(msg.prompt_tokens)
    check_token(model, bad, "prompt token")
    check_k(msg.k)
    sampling_from_pb(msg.sampling)
