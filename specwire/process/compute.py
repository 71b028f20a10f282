"""Where all MLX work of a process runs: one compute thread, off the event loop.

Both roles run asyncio (grpc.aio, AsyncZeroconf) on the main thread and all
MLX work on one compute thread per process (``ComputeThread.run``). One
thread, because MLX 0.31.2 and later give each thread its own default
stream, and on Metal an array made on one thread cannot be evaluated on
another ("There is no Stream(gpu, 0) in current thread"); it also serialises
sessions on the single GPU (or CPU) the way the hardware would anyway. Off
the event loop, because the loop answers Hello, the health service, new
connections and Bonjour queries: a worker whose loop waited behind its
sessions' forward passes looked dead under load (8 sessions of the default
model: Hello timed out after 10 s). A worker used to offer computing on the
loop's own thread (``--compute loop``); the CHANGELOG has the figure that
retired it.

A job goes to the thread through a ``SimpleQueue`` and comes back with one
``call_soon_threadsafe`` that settles an asyncio future: no
``concurrent.futures.Future`` in between, whose callback chain cost about
50 µs each way on a 2-vCPU virtual machine.

The thread is a daemon that lives as long as the process. It must never run
its thread-exit destructors while the interpreter shuts down: MLX keeps
thread-local compile caches whose destructors take the GIL, and running them
during finalization aborts the process ("terminate called without an active
exception"). So the thread is never stopped, and the command lines leave
through ``specwire.process.command_line.exit_process``, which skips finalization.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_Job = tuple[
    Callable[..., Any], tuple[Any, ...], dict[str, Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"
]


class ComputeThread:
    """One daemon thread running submitted functions in order."""

    def __init__(self, name: str = "mlx-compute") -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            fn, args, kwargs, loop, future = self._jobs.get()
            if future.cancelled():
                continue
            try:
                outcome: tuple[bool, Any] = (True, fn(*args, **kwargs))
            except BaseException as err:  # handed to the awaiting caller, not swallowed
                outcome = (False, err)
            with contextlib.suppress(RuntimeError):  # the loop closed while the job ran
                loop.call_soon_threadsafe(_settle, future, outcome)

    @property
    def idle(self) -> bool:
        """Whether no job waits for the thread (a job that runs may use it to go on a while longer)."""
        return self._jobs.empty()

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on the compute thread and await its result.

        Cancelling the awaiting task does not interrupt ``fn`` once it runs;
        it finishes on the thread and its result is dropped.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, args, kwargs, loop, future))
        return await future


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    """On the loop: hand a job's result or exception to its awaiting caller, unless it gave up."""
    if future.cancelled():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


_shared: ComputeThread | None = None
_shared_lock = threading.Lock()


def compute_thread() -> ComputeThread:
    """The process's compute thread, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ComputeThread()
        return _shared
