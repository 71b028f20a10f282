"""The portal from the compute thread into the coordinator's event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from coordinator.runtime import LoopPortal, coordinator_runtime

pytestmark = pytest.mark.anyio


async def _add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


async def _loop_thread() -> int:
    return threading.get_ident()


async def _boom() -> None:
    raise ValueError("on the loop")


def _calls(portal: LoopPortal) -> list[object]:
    """What a compute-thread caller sees, in order."""
    seen: list[object] = [portal.call(_add, 2, b=3), portal.call(_loop_thread)]
    with pytest.raises(ValueError, match="on the loop"):
        portal.call(_boom)
    with pytest.raises(TypeError):
        portal.call(_add, 1)  # type: ignore[call-arg]  # a bad call raises in the caller, not on the loop
    return seen


async def test_the_portal_runs_calls_on_the_loop_and_returns_or_raises_in_the_caller() -> None:
    async with coordinator_runtime() as runtime:
        added, thread = await runtime.compute.run(_calls, runtime.portal)
        assert added == 5 and thread == threading.get_ident()
        with pytest.raises(RuntimeError, match="wait forever"):
            runtime.portal.call(_add, 1, 2)
