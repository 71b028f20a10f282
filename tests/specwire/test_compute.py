"""Where MLX work runs: a compute thread of its own, or the event loop's thread."""

from __future__ import annotations

import threading

import pytest

from specwire.compute import ComputeThread, LoopCompute

pytestmark = pytest.mark.anyio


def _boom() -> None:
    raise ValueError("from the job")


async def test_loop_compute_runs_on_the_loop_thread_in_order_and_raises() -> None:
    compute, order = LoopCompute(), []
    assert await compute.run(threading.get_ident) == threading.get_ident()
    for i in range(3):
        await compute.run(order.append, i)
    assert order == [0, 1, 2]
    with pytest.raises(ValueError, match="from the job"):
        await compute.run(_boom)


async def test_compute_thread_runs_elsewhere_and_raises() -> None:
    compute = ComputeThread("test-compute")
    assert await compute.run(threading.get_ident) != threading.get_ident()
    with pytest.raises(ValueError, match="from the job"):
        await compute.run(_boom)
