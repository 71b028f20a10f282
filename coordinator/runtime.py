"""The coordinator's process layout: asyncio on the main thread, MLX on the compute thread.

The engine is synchronous and runs on the compute thread, with the target
model. Remote draft sources reach the event loop, where their gRPC channels
live, through an anyio blocking portal.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from anyio.from_thread import BlockingPortal

from specwire.compute import ComputeThread, compute_thread


@dataclass
class Runtime:
    """The compute thread and the portal back into the event loop."""

    compute: ComputeThread
    portal: BlockingPortal


@asynccontextmanager
async def coordinator_runtime() -> AsyncIterator[Runtime]:
    """The process's compute thread, and a portal into this event loop for its duration."""
    async with BlockingPortal() as portal:
        yield Runtime(compute_thread(), portal)
