"""The per-op executor on a hybrid model refuses every malformed operation with a clear error.

Property-based: Hypothesis takes valid passes (each rolled back after it)
and changes one field of one operation: its code (another operation, or
none), an input (another operation of the walk, an unknown handle), an
output, an arg (a count or position, small or huge), or drops inputs. Each
pass must run or raise ``InvalidArgumentError`` (which the worker answers
with INVALID_ARGUMENT); anything else would reach the client as INTERNAL. A
refusal ends the session, whose cache may hold half a pass, as it ends the
stream; otherwise a valid pass still works.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel, load_model
from specwire.v1 import draft_pb2 as pb
from tests.support.walks import ops, walked

outcomes = {"ran": 0, "refused": 0}
CODES = ("SET_TENSOR", "GET_TENSOR", "KV_TRIM", "ARGMAX", "STEP")
refused_at: set[str] = set()
FIELDS = ("code", "inputs", "outputs", "args", "drop")


@pytest.fixture(scope="module")
def hybrid() -> LoadedModel:
    return load_model("tiny-hybrid-draft")


@st.composite
def mutation(draw: st.DrawFn) -> tuple[int, str, int, int]:
    """Which operation of a pass to change, which field, at which place, to what."""
    value = draw(st.one_of(st.integers(-3, 40), st.integers(0, 2**40)))
    return draw(st.integers(0, 200)), draw(st.sampled_from(FIELDS)), draw(st.integers(0, 5)), value


def mutate(pass_ops: list[pb.Op], where: int, field: str, place: int, value: int) -> list[pb.Op]:
    """``pass_ops`` with one field of one operation changed (or its inputs dropped)."""
    pass_ops = [pb.Op.FromString(op.SerializeToString()) for op in pass_ops]
    op = pass_ops[where % len(pass_ops)]
    if field == "code":
        op.code = (pb.SET_TENSOR, pb.GET_TENSOR, pb.KV_TRIM, pb.ARGMAX, pb.STEP, 99)[place]
        return pass_ops
    if field == "drop":
        del op.inputs[place % max(1, len(op.inputs)) :]
        return pass_ops
    values = getattr(op, field)
    if values:
        values[place % len(values)] = value if field == "args" else abs(value)  # handles are unsigned
    else:
        values.append(abs(value))
    return pass_ops


@settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(mutation(), min_size=1, max_size=4))
def test_malformed_hybrid_operations_are_refused_clearly(
    hybrid: LoadedModel, mutations: list[tuple[int, str, int, int]]
) -> None:
    session, graph = walked(hybrid)
    session.execute(ops(graph, 0, [3, 1, 4, 1]))
    for where, field, place, value in mutations:
        pass_ops = [*ops(graph, session.position, [5, 9]), graph.trim(2)]
        try:
            session.execute(mutate(pass_ops, where, field, place, value))
            outcomes["ran"] += 1
        except InvalidArgumentError as err:
            outcomes["refused"] += 1
            refused_at.update(code for code in CODES if f"({code})" in str(err))
            with pytest.raises(InvalidArgumentError, match="the session ended at a refused operation"):
                session.execute(ops(graph, session.position, [5]))
            return
    row = session.execute(ops(graph, session.position, [5])).tensors[-1]
    assert np.isfinite(np.frombuffer(row, dtype=np.float32)).all()


def test_the_fuzz_reached_both_outcomes() -> None:
    print(f"hybrid executor fuzz: {outcomes}, refused at {sorted(refused_at)}")
    assert outcomes["ran"] >= 5 and outcomes["refused"] >= 150, outcomes
    assert refused_at == set(CODES)  # every operation met malformed input
