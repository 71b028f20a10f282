"""The paper's machines written as a measured set-up, for tests of the planner's and auto's arithmetic."""

from __future__ import annotations

from coordinator.planning.measured import MeasuredSetup, WorkerSpeed
from specwire.emulation.profile import PassCurve


def paper_setup(tree_b: bool = True) -> MeasuredSetup:
    """The M2 Ultra's target and draft and two workers, ``a`` (M1 Max) and ``b`` (M2 Pro, maybe without
    trees)."""
    workers = (
        WorkerSpeed("a", "M1 Max", "127.0.0.1:1", PassCurve(86.6), 3e-4, True, "d"),
        WorkerSpeed("b", "M2 Pro", "127.0.0.1:2", PassCurve(62.9), 3e-4, tree_b, "d"),
    )
    return MeasuredSetup(PassCurve(42.4), PassCurve(140.2), None, workers)
