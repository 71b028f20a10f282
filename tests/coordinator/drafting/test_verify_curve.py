"""The target's verification curve, measured where it turns: a tree is sized to what a pass really costs."""

from __future__ import annotations

import pytest

import coordinator.drafting.local_tree as local_tree
from coordinator.drafting.local_tree import measure_verify_curve
from specwire.emulation.pace import Pacer, pace_model
from specwire.emulation.paper import load_profile
from specwire.models.loading import LoadedModel


def test_a_paced_27b_target_is_measured_where_its_curve_turns(tiny: LoadedModel) -> None:
    # The M2 Ultra's 27B: every pass reads the weights (52.2 ms) until its positions' compute takes
    # longer (388 a second): 20 positions cost what one does, 24 cost 61.9 ms, 32 cost 82.5 ms.
    machine = load_profile("m2-ultra-27b").target_machine
    assert machine.target is not None
    target = pace_model(tiny, Pacer(machine.target, "m2-ultra-27b:m2-ultra"))
    curve = measure_verify_curve(target, context=8)
    assert {20, 24} <= set(curve.positions)
    assert curve.at(20) == pytest.approx(curve.at(1), rel=0.05)  # interpolated from 16 to 32: +15%
    assert curve.at(24) == pytest.approx(24 / 388.0, rel=0.05)


@pytest.mark.parametrize(
    ("name", "pass_s", "added"),
    [
        ("rising all along (a CPU)", lambda n: 0.01 * n, set()),
        ("flat, then rising (a GPU)", lambda n: max(0.0522, n / 388.0), {20, 24}),
        ("flat all along", lambda n: 0.0522, set()),
    ],
)
def test_points_are_added_only_where_a_flat_curve_starts_to_rise(name: str, pass_s, added: set) -> None:  # type: ignore[no-untyped-def]
    points = {n: pass_s(n) for n in local_tree.CURVE_POSITIONS}
    measured: list[int] = []

    def measure(n: int) -> float:
        measured.append(n)
        return pass_s(n)

    local_tree._knee(points, measure)
    assert set(measured) == added, name
    assert set(points) == set(local_tree.CURVE_POSITIONS) | added
