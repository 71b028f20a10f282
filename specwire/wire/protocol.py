"""The stream protocol's constants and the conversions both ends share.

The generated messages live in ``specwire.v1.draft_pb2`` (see proto/). The
Draft stream is registered without serializers on both ends, so each side
encodes and decodes its messages here, explicitly, and times it: those
durations are part of the protocol cost the bench attributes.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from specwire.drafting.sampling import SamplingParams, SparseDistribution
from specwire.drafting.token_tree import TokenTree
from specwire.emulation.pace import Pace
from specwire.errors import InvalidArgumentError
from specwire.v1 import draft_pb2 as pb
from specwire.wire.timing import ServerTiming

if TYPE_CHECKING:  # the drafter brings in mlx-lm, which the commands that load no model must not pay for
    from specwire.drafting.drafter import DraftBlock

# 2: tree replies (Round.tree_nodes, Drafts.parents); 3: the per-op walk traced from the model (Op STEP);
# 4: a fill session opened ahead and caught up (Round.catch_up)
PROTOCOL_VERSION = 4
SERVICE_NAME = "specwire.v1.DraftWorker"
HELLO_METHOD = f"/{SERVICE_NAME}/Hello"
DRAFT_METHOD = f"/{SERVICE_NAME}/Draft"
ECHO_METHOD = f"/{SERVICE_NAME}/Echo"
ECHO_STREAM_METHOD = f"/{SERVICE_NAME}/EchoStream"
TENSOR_SERVICE_NAME = "specwire.v1.TensorWorker"
EXECUTE_METHOD = f"/{TENSOR_SERVICE_NAME}/Execute"
BACKEND_STREAM = "stream"
BACKEND_PER_OP = "ggml-rpc"
MAX_K = 32
MAX_TREE_NODES = 256  # the most nodes a Round may ask a tree of


def sampling_to_pb(params: SamplingParams) -> pb.SamplingParams:
    """Sampling parameters as a protocol message."""
    return pb.SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        draft_top_k=params.draft_top_k,
        seed=params.seed,
    )


def sampling_from_pb(msg: pb.SamplingParams) -> SamplingParams:
    """Sampling parameters from a message; out-of-range values raise ``InvalidArgumentError``."""
    return SamplingParams(
        temperature=msg.temperature,
        top_p=msg.top_p,
        top_k=msg.top_k,
        draft_top_k=msg.draft_top_k,
        seed=msg.seed,
    )


def drafts_to_pb(seq: int, block: DraftBlock) -> pb.Drafts:
    """The tokens and sparse distributions of a block (timing and counters are added by the caller)."""
    msg = pb.Drafts(seq=seq, tokens=block.tokens)
    if block.dists:
        msg.dist_sizes.extend(d.ids.size for d in block.dists)
        msg.dist_ids.extend(np.concatenate([d.ids for d in block.dists]).tolist())
        msg.dist_probs.extend(np.concatenate([d.probs for d in block.dists]).tolist())
    if block.tree is not None:
        msg.parents.extend(block.tree.parents)
        msg.node_probs.extend(block.tree_probs)
    return msg


def tree_from_pb(msg: pb.Drafts) -> TokenTree | None:
    """The tree of drafts a Drafts message carries (None for a chain); a malformed one is refused."""
    if not msg.parents:
        return None
    if len(msg.node_probs) not in (0, len(msg.tokens)):
        raise InvalidArgumentError("malformed Drafts: node probabilities do not match the tree's nodes")
    return TokenTree(tuple(msg.tokens), tuple(msg.parents))


def dists_from_pb(msg: pb.Drafts) -> list[SparseDistribution] | None:
    """The sparse distributions of a Drafts message, or None when it carries none (greedy)."""
    if not msg.dist_sizes:
        return None
    sizes = list(msg.dist_sizes)
    if (
        len(sizes) != len(msg.tokens)
        or sum(sizes) != len(msg.dist_ids)
        or len(msg.dist_ids) != len(msg.dist_probs)
    ):
        raise InvalidArgumentError(
            "malformed Drafts: distribution sizes do not match the ids and probabilities"
        )
    ids = np.asarray(msg.dist_ids, dtype=np.int64)
    probs = np.asarray(msg.dist_probs, dtype=np.float64)
    bounds = np.cumsum([0, *sizes])
    return [SparseDistribution(ids[a:b], probs[a:b]) for a, b in itertools.pairwise(bounds)]


def timing_from_pb(msg: pb.ServerTiming) -> ServerTiming:
    """Worker durations from a message."""
    return ServerTiming(
        deserialize_ns=msg.deserialize_ns,
        receive_to_start_ns=msg.receive_to_start_ns,
        compute_ns=msg.compute_ns,
        compute_to_reply_ns=msg.compute_to_reply_ns,
        serialize_ns=msg.serialize_ns,
        previous_send_ns=msg.previous_send_ns,
        arrived_at_ns=msg.arrived_at_ns,
        encoded_at_ns=msg.encoded_at_ns,
    )


def pace_to_pb(pace: Pace | None) -> pb.Pace | None:
    """A paced worker's Pace message (None for a worker at its own speed)."""
    if pace is None:
        return None
    curve = pace.draft_curve()
    return pb.Pace(
        profile=pace.profile.name,
        machine=pace.machine.key,
        machine_name=pace.machine.name,
        draft_tokens_per_second=1 / curve.pass_s(),
    )
