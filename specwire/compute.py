"""The compute thread: where all MLX work of a process runs.

Both roles run asyncio (grpc.aio, AsyncZeroconf) on the main thread and keep
model compute off it, so a forward pass never stalls network I/O. MLX work
goes to one dedicated thread per process: MLX streams are per thread on some
backends, and one thread also serialises sessions on the single GPU (or CPU)
the way the hardware would anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class ComputeThread:
    """A single worker thread; ``await compute.run(fn, *args)`` runs ``fn`` there."""

    def __init__(self, name: str = "mlx-compute") -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` on the compute thread and await its result.

        Cancelling the awaiting task does not interrupt ``fn``; it finishes on
        the thread and its result is dropped.
        """
        future = self._executor.submit(fn, *args, **kwargs)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Let queued work finish, then stop the thread."""
        self._executor.shutdown(wait=True)

    def __enter__(self) -> ComputeThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
