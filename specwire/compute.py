"""Where all MLX work of a process runs: one compute thread, or the event loop's own thread.

Both roles run asyncio (grpc.aio, AsyncZeroconf) on the main thread. MLX
work goes to one thread per process: MLX streams are per thread on some
backends, and one thread also serialises sessions on the single GPU (or CPU)
the way the hardware would anyway. Two placements share one interface
(``run``):

* ``ComputeThread``: a thread of its own, so a forward pass never stalls
  network I/O, at the price of two thread hand-offs per call (0.1-0.2 ms
  each on a 2-vCPU virtual machine). The coordinator uses it: its event loop also
  serves HTTP and Bonjour while the target verifies.
* ``LoopCompute``: the event loop's own thread. No hand-off; while a pass
  runs, the loop does nothing else. A worker uses it by default (``worker
  serve --compute loop``): its sessions share one device and wait for each
  other's passes either way, and a round's reply is what the loop would be
  waiting for.

The thread is a daemon that lives as long as the process. It must never run
its thread-exit destructors while the interpreter shuts down: MLX keeps
thread-local compile caches whose destructors take the GIL, and running them
during finalization aborts the process ("terminate called without an active
exception"). So the thread is never stopped, and the command lines leave
through ``specwire.command_line.exit_process``, which skips finalization.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_Job = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], "Future[Any]"]


class ComputeThread:
    """One daemon thread running submitted functions in order."""

    def __init__(self, name: str = "mlx-compute") -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            fn, args, kwargs, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as err:  # handed to the awaiting caller, not swallowed
                future.set_exception(err)
            else:
                future.set_result(result)

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Queue ``fn(*args, **kwargs)``; returns its future."""
        future: Future[T] = Future()
        self._jobs.put((fn, args, kwargs, future))
        return future

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on the compute thread and await its result.

        Cancelling the awaiting task does not interrupt ``fn`` once it runs;
        it finishes on the thread and its result is dropped.
        """
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))


class LoopCompute:
    """Runs functions on the calling event loop's thread, to their end.

    ``run`` does not yield to the loop before or after ``fn``: a round's
    reply goes out before anything else runs. A caller that loops over many
    jobs (pre-speculation) yields between them itself. Every call must come
    from the one event loop (MLX stays on its thread).
    """

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` here and return its result."""
        return fn(*args, **kwargs)


Compute = ComputeThread | LoopCompute
"""Either placement: both have ``run``."""

_shared: ComputeThread | None = None
_shared_lock = threading.Lock()


def compute_thread() -> ComputeThread:
    """The process's compute thread, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ComputeThread()
        return _shared
