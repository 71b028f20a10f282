"""The per-op executor on a hybrid model refuses every malformed operation with a clear error.

Property-based: Hypothesis takes valid passes (each rolled back after it)
and changes one field of one operation: its code (mostly to another hybrid
code), an input (a slot, another module, a foreign or unknown handle), an
output, an arg (a layer, head count or position, small or huge), or drops
inputs. Each pass must run or raise ``InvalidArgumentError`` (which the
worker answers with INVALID_ARGUMENT); anything else would reach the client
as INTERNAL. A pass refused half-way leaves the session refusing rollbacks
by name; otherwise a valid pass still works.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.drafting.ggml_rpc.graph import ForwardGraph, ModelShape
from specwire.errors import InvalidArgumentError
from specwire.models import LoadedModel, load_model
from specwire.v1 import draft_pb2 as pb
from worker.tensor_modules import ModuleTable
from worker.tensor_session import TensorSession

TAG = 7
outcomes = {"ran": 0, "refused": 0}
HYBRID_CODES = (
    "CONV_STATE",
    "QKV_SPLIT",
    "GATED_DELTA",
    "GATED_NORM",
    "HEAD_SPLIT",
    "HEAD_NORM",
    "ROPE_HEADS",
    "SIGMOID_GATE",
)
refused_at: set[str] = set()


@pytest.fixture(scope="module")
def hybrid() -> LoadedModel:
    return load_model("tiny-hybrid-draft")


@pytest.fixture(scope="module")
def table(hybrid: LoadedModel) -> ModuleTable:
    return ModuleTable.of(hybrid.model)


FIELDS = ("code", "inputs", "outputs", "args", "drop")


@st.composite
def mutation(draw: st.DrawFn) -> tuple[int, str, int, int]:
    """Which operation of a pass to change, which field, at which place, to what."""
    value = draw(st.one_of(st.integers(-3, 40), st.integers(0, 2**40), st.integers(7 << 32, (7 << 32) + 40)))
    return draw(st.integers(0, 200)), draw(st.sampled_from(FIELDS)), draw(st.integers(0, 5)), value


def mutate(ops: list[pb.Op], where: int, field: str, place: int, value: int) -> list[pb.Op]:
    """``ops`` with one field of one operation changed (or one input dropped)."""
    ops = [pb.Op.FromString(op.SerializeToString()) for op in ops]
    op = ops[where % len(ops)]
    if field == "code":
        op.code = pb.CONV_STATE + value % 8 if value >= 0 else value  # mostly another hybrid code
        return ops
    if field == "drop":
        del op.inputs[place % max(1, len(op.inputs)) :]
        return ops
    values = getattr(op, field)
    if values:
        values[place % len(values)] = value if field == "args" else abs(value)  # handles are unsigned
    else:
        values.append(abs(value))
    return ops


@settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(mutation(), min_size=1, max_size=4))
def test_malformed_hybrid_operations_are_refused_clearly(
    hybrid: LoadedModel, table: ModuleTable, mutations: list[tuple[int, str, int, int]]
) -> None:
    session = TensorSession(hybrid, table, TAG)
    graph = ForwardGraph(ModelShape.from_config(hybrid.args), table.names, TAG)
    session.execute([op for group in graph.forward(0, [3, 1, 4, 1]) for op in group])
    for where, field, place, value in mutations:
        fed = session.fed()
        if fed is None:  # a refused pass stopped half-way: the executor says so, and the fuzz ends
            with pytest.raises(InvalidArgumentError, match="middle of a forward pass"):
                session.execute([graph.trim(1)])
            return
        ops = [op for group in graph.forward(fed, [5, 9]) for op in group] + [graph.trim(2)]
        try:
            session.execute(mutate(ops, where, field, place, value))
            outcomes["ran"] += 1
        except InvalidArgumentError as err:
            outcomes["refused"] += 1
            refused_at.update(code for code in HYBRID_CODES if f"({code})" in str(err))
    fed = session.fed()
    if fed is not None:
        row = session.execute([op for group in graph.forward(fed, [5]) for op in group]).tensors[-1]
        assert np.isfinite(np.frombuffer(row, dtype=np.float32)).all()


def test_the_fuzz_reached_both_outcomes() -> None:
    print(f"hybrid executor fuzz: {outcomes}, refused at {sorted(refused_at)}")
    assert outcomes["ran"] >= 5 and outcomes["refused"] >= 200, outcomes
    assert refused_at == set(HYBRID_CODES)  # every hybrid operation met malformed input
