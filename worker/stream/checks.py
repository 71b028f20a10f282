"""What a stream session checks before it touches its model: the Open message (its peer through
``worker.server.peer``, which the per-op executor shares), each Round, each token and k, and the
pre-speculation settings a session asks for."""

from __future__ import annotations

from specwire.drafting.ahead.draft_tree import tree_batchable
from specwire.drafting.ahead.prespec_config import PrespecConfig
from specwire.drafting.drafter import Drafter
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import MAX_K, MAX_TREE_NODES, sampling_from_pb
from worker.server.peer import check_peer


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


def check_round(
    model: LoadedModel,
    msg: pb.Round,
    *,
    next_seq: int,
    fill: bool,
    tree: bool,
    greedy: bool,
    drafted: int,
    context: int,
) -> None:
    """Raise ``InvalidArgumentError`` unless ``msg`` is a session's next valid round: ``next_seq`` expected,
    a ``fill`` session, one that drafts a ``tree``, at T = 0 (``greedy``), ``drafted`` drafts last round, and
    ``context`` tokens held."""
    if msg.seq != next_seq:
        raise InvalidArgumentError(f"round seq {msg.seq} out of order; expected {next_seq}")
    if fill and not msg.appended:
        raise InvalidArgumentError(f"round {msg.seq}: a fill session's rounds must carry appended")
    if msg.tree_nodes and (not tree or not fill):
        raise InvalidArgumentError(
            f"round {msg.seq}: tree_nodes needs a session that drafts a tree and fills"
        )
    if tree and not msg.tree_nodes and not greedy:
        raise InvalidArgumentError(
            f"round {msg.seq}: a tree session at T > 0 answers trees only (tree_nodes), which the "
            "target verifies by its own draws; a chain of first choices needs temperature 0"
        )
    if msg.tree_nodes > MAX_TREE_NODES:
        raise InvalidArgumentError(
            f"round {msg.seq}: tree_nodes={msg.tree_nodes}; a round takes at most {MAX_TREE_NODES}"
        )
    if msg.catch_up and not (fill and msg.appended):
        raise InvalidArgumentError(
            f"round {msg.seq}: catch_up needs a fill session and the tokens decoded since (appended)"
        )
    if msg.accepted > drafted and not msg.catch_up:  # a catch-up's tokens are no verdict on the drafts
        raise InvalidArgumentError(
            f"round {msg.seq}: accepted {msg.accepted} exceeds the {drafted} drafts of the last round"
        )
    check_token(model, msg.token, f"round {msg.seq} token")
    if msg.appended:
        if len(msg.appended) != msg.accepted + 1 or msg.appended[-1] != msg.token:
            raise InvalidArgumentError(
                f"round {msg.seq}: appended must hold the {msg.accepted} accepted tokens, then the token"
            )
        check_token(model, max(msg.appended), f"round {msg.seq} appended token")
    check_k(msg.k)
    room = model.context_length - context - msg.accepted - 1
    if msg.k > room:
        raise InvalidArgumentError(
            f"round {msg.seq}: k={msg.k} would run past the model's context of {model.context_length}"
        )
