"""Serving requests one at a time per target: the bounded queue, and each generation's token stream.

The target model and its compute thread serve one generation at a time, so
requests wait in order for the one lock; at most ``max_queue`` may wait, and
the next one is refused with ``QueueFullError`` (HTTP 429) and an estimate of
when to retry. Each admitted request runs as a task of the scheduler's own
task group, not of the HTTP request: if its client leaves, the handler sets
``halt`` and returns, and the generation ends at the next round boundary
(closing its worker session) before the next request starts.

Tokens go from the engine, on the compute thread, to the event loop with
``call_soon_threadsafe``, into an unbounded memory stream the handler reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from coordinator.decoding.engine import GenerationResult, SpeculativeDecoder
from coordinator.drafting.auto import AUTO_K, AutoDraftSource
from coordinator.drafting.base import DraftSource
from coordinator.drafting.factory import DraftSources, DraftSpec
from coordinator.drafting.provenance import drafted_by
from coordinator.planning.planner import Planner
from coordinator.runtime import Runtime
from coordinator.serving.requests import CompletionRequest
from specwire.errors import CapacityError, NoWorkerError, QueueFullError, RemoteWorkerError

RECENT = 16  # generations whose durations estimate Retry-After


@dataclass(eq=False)  # one per request: compared, and kept in sets, by identity
class Generation:
    """One admitted request as it runs: its token stream, and at the end its result or error."""

    request: CompletionRequest
    tokens: MemoryObjectReceiveStream[list[int]]
    halt: threading.Event = field(default_factory=threading.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    submitted_ns: int = field(default_factory=time.perf_counter_ns)
    started_ns: int = 0
    result: GenerationResult | None = None
    error: Exception | None = None
    source: dict[str, Any] = field(default_factory=dict)  # the draft source used, and its provenance
    generated: int = 0  # tokens delivered so far (the compute thread counts them)
    rounds: int = 0  # rounds that delivered tokens so far

    @property
    def queued_s(self) -> float:
        """Seconds spent waiting for the target."""
        return (self.started_ns - self.submitted_ns) / 1e9 if self.started_ns else float("nan")


@dataclass(frozen=True)
class Drafting:
    """How every request is drafted: the source, and for a fixed set-up its k (as ``generate`` has them)."""

    spec: DraftSpec
    k: int


class Scheduler:
    """Admits requests into a bounded queue and runs them one at a time on the target."""

    def __init__(self, runtime: Runtime, sources: DraftSources, drafting: Drafting, max_queue: int) -> None:
        self.runtime = runtime
        self.sources = sources
        self.drafting = drafting
        self.max_queue = max_queue
        self._live: set[Generation] = set()  # running and waiting
        self._lock = anyio.Lock()
        self._durations: deque[float] = deque(maxlen=RECENT)
        self._tg: TaskGroup | None = None
        # One engine for the server's life; each generation (one at a time, under the lock) sets its own
        # draft source on it.
        caches = sources.caches
        target_cache = caches.of(f"target:{sources.target.spec}") if caches is not None else None
        self._decoder = SpeculativeDecoder(sources.target, None, prefix_cache=target_cache)
        self.last_drafting: dict[str, Any] | None = None  # the drafting policy's report of the last request
        self.planner: Planner | None = None  # the drafting policy's, as the last request (or start) had it

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Scheduler]:
        """Run generations for as long as the block lasts."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                yield self
            finally:
                self._tg = None
                for generation in self._live:  # the engine stops at its next round and closes its session
                    generation.halt.set()
                tg.cancel_scope.cancel()

    @property
    def pending(self) -> int:
        """Requests running or waiting whose client is still there."""
        return sum(1 for g in self._live if not g.halt.is_set())

    def submit(self, request: CompletionRequest) -> Generation:
        """Queue ``request``; raises ``QueueFullError`` when ``max_queue`` already wait."""
        if self._tg is None:
            raise RuntimeError("the scheduler is not running")
        if self.pending >= 1 + self.max_queue:
            raise QueueFullError(
                f"{self.pending - 1} requests are already waiting (the most is {self.max_queue})",
                self.retry_after_s(),
            )
        send, receive = anyio.create_memory_object_stream[list[int]](math.inf)
        generation = Generation(request, receive)
        self._live.add(generation)
        self._tg.start_soon(self._run, generation, send)
        return generation

    def status(self) -> list[dict[str, Any]]:
        """Each request running or waiting: its state, set-up, prompt, tokens and rounds so far, tok/s."""
        now = time.perf_counter_ns()
        out = []
        for g in sorted(self._live, key=lambda g: g.submitted_ns):
            running = bool(g.started_ns)
            elapsed_s = (now - g.started_ns) / 1e9 if running else 0.0
            out.append(
                {
                    "state": "running" if running else "waiting",
                    "kind": g.request.kind,
                    "prompt_tokens": len(g.request.prompt),
                    "max_tokens": g.request.max_tokens,
                    "temperature": g.request.params.temperature,
                    "setup": g.source.get("draft"),
                    "generated": g.generated,
                    "rounds": g.rounds,
                    "tok_s": round(g.generated / elapsed_s, 2) if elapsed_s > 0 else None,
                    "waited_s": round(((g.started_ns or now) - g.submitted_ns) / 1e9, 3),
                    "client_left": g.halt.is_set(),
                }
            )
        return out

    def retry_after_s(self) -> int:
        """Whole seconds until a queue slot is likely free: the median recent generation, per one ahead."""
        typical = statistics.median(self._durations) if self._durations else 1.0
        return max(1, math.ceil(typical * max(1, self.pending - self.max_queue)))

    async def _run(self, generation: Generation, send: MemoryObjectSendStream[list[int]]) -> None:
        try:
            async with self._lock:
                generation.started_ns = time.perf_counter_ns()
                if not generation.halt.is_set():  # its client may have left while it waited
                    await self._generate(generation, send)
                    self._durations.append((time.perf_counter_ns() - generation.started_ns) / 1e9)
        except Exception as err:  # handed to the request's handler, which answers with it
            generation.error = err
        finally:
            self._live.discard(generation)
            send.close()
            generation.done.set()

    async def _generate(self, generation: Generation, send: MemoryObjectSendStream[list[int]]) -> None:
        source, generation.source = await self._open()
        loop = asyncio.get_running_loop()

        def deliver(tokens: list[int]) -> None:  # on the compute thread
            generation.generated += len(tokens)
            generation.rounds += 1
            loop.call_soon_threadsafe(_send_quietly, send, list(tokens))

        if isinstance(source, AutoDraftSource):
            self.planner = source.planner
        request, drafting = generation.request, self.drafting
        k = 0 if source is None else AUTO_K if isinstance(source, AutoDraftSource) else drafting.k
        generation.source["k"] = k
        decoder = self._decoder
        decoder.source = source
        generation.result = await self.runtime.compute.run(
            decoder.generate,
            request.prompt,
            max_tokens=request.max_tokens,
            k=k,
            params=request.params,
            on_tokens=deliver,
            halt=generation.halt,
        )
        generation.source.update(drafted_by(source))
        if isinstance(source, AutoDraftSource):
            self.last_drafting = generation.source["drafting"] = source.report()

    async def _open(self) -> tuple[DraftSource | None, dict[str, Any]]:
        """This request's draft source; with no worker to be had, what ``--on-worker-loss`` says."""
        spec = self.drafting.spec
        named = spec.kind in ("local", "local-tree")
        described = {"draft": f"{spec.kind}:{spec.local}" if named else spec.kind}
        if spec.kind == "remote":
            described["backend"] = spec.backend
        try:
            return await self.sources.open(spec), described
        except (NoWorkerError, RemoteWorkerError, CapacityError) as err:
            if spec.kind != "remote" or spec.on_loss == "fail":
                raise
            described["draft_unavailable"] = str(err)
            if spec.on_loss == "local" and spec.local:
                local = DraftSpec("local", local=spec.local)
                return await self.sources.open(local), {**described, "draft": f"local:{local.local}"}
            return None, {**described, "draft": "none"}


def _send_quietly(send: MemoryObjectSendStream[list[int]], tokens: list[int]) -> None:
    """Pass tokens on; a reader that has gone away (its client left) is no error."""
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        send.send_nowait(tokens)
