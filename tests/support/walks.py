"""A per-op session run in this process: the worker's executor and the coordinator's graph of one model."""

from __future__ import annotations

from coordinator.drafting.ggml_rpc.graph import ForwardGraph, Walk
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from worker.per_op.op_walk import trace
from worker.per_op.tensor_session import TensorSession


def walked(model: LoadedModel) -> tuple[TensorSession, ForwardGraph]:
    """A tensor session of ``model`` and the graph a coordinator builds from the walk it announces."""
    walk = trace(model.model)
    return TensorSession(model, walk), ForwardGraph(Walk.of(walk.announce()))


def ops(graph: ForwardGraph, offset: int, tokens: list[int] | None) -> list[pb.Op]:
    """One forward pass's operations, ungrouped."""
    return [op for group in graph.forward(offset, tokens) for op in group]
