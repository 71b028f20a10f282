"""Where MLX work runs: one compute thread per process, off the event loop."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from specwire.process.compute import ComputeThread

pytestmark = pytest.mark.anyio


def _boom() -> None:
    raise ValueError("from the job")


async def test_compute_thread_runs_elsewhere_in_order_and_raises() -> None:
    compute, order = ComputeThread("test-compute"), []
    assert await compute.run(threading.get_ident) != threading.get_ident()
    for i in range(3):
        await compute.run(order.append, i)
    assert order == [0, 1, 2]
    with pytest.raises(ValueError, match="from the job"):
        await compute.run(_boom)


async def test_the_loop_runs_while_a_job_computes_and_a_caller_may_give_up() -> None:
    compute = ComputeThread("test-compute-busy")
    done = threading.Event()

    def slow() -> str:
        time.sleep(0.3)
        done.set()
        return "slow"

    ticks = 0
    with anyio.move_on_after(0.05):  # the caller gives up; the job runs on to its end
        await compute.run(slow)
    while not done.is_set():  # the event loop is not held by the job
        ticks += 1
        await anyio.sleep(0.005)
    assert ticks >= 10
    assert await compute.run(str, 7) == "7"  # the thread went on after the abandoned job
