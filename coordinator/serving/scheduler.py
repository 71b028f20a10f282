"""Serving several requests at once per target: admission, rounds batched or in turn, each token stream.

Up to ``concurrency`` generations are active at once, on the compute thread.
New requests are admitted between rounds (their prompt prefilled, from the
prompt cache when there is one); at most ``max_queue`` more may wait, and
the next one is refused with ``QueueFullError`` (HTTP 429) and an estimate
of when to retry.

A request alone is drafted as the drafting set-up says (auto's best set-up:
a worker's tree, local tree SD, ...). Once two or more are active, and the
set-up drafts with a local model (``auto`` or ``local``) that batches with the
target (KV caches, or dense Qwen3.5's Gated DeltaNet layers:
``batch_refusal``), they are decoded together
(``coordinator.decoding.batch``): one batched draft pass a draft for all of
them and one target pass verifying all their chains, each request at its
own k (auto's: the planner's best local chain at the request's
temperature). A request already running joins with its target cache as it
stands, its own draft source closed. Under auto, the last request left in
the batch goes on alone with a draft source chosen again (``_release``).
Otherwise (a worker named, a windowed or other recurrent model) the generations
take a round each in turn (``Decoding.round``), a new one first, and share
the target's speed. Either way every request keeps its own sampling
parameters, stops and seed, so at T = 0 each output is what it would be
alone. If a client leaves, its handler sets ``halt``, and the
generation ends at its next round (closing its worker session), freeing its
slot.

Tokens go from the engine, on the compute thread, to the event loop with
``call_soon_threadsafe``, into an unbounded memory stream the handler reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from coordinator.decoding.engine import Decoding, SpeculativeDecoder
from coordinator.drafting.auto.policy import AUTO_K, AutoDraftSource
from coordinator.drafting.base import DraftSource
from coordinator.drafting.factory import DraftSources
from coordinator.drafting.provenance import drafted_by
from coordinator.drafting.spec import DraftSpec
from coordinator.planning.planner import Planner
from coordinator.runtime import Runtime
from coordinator.serving.batching import Batching
from coordinator.serving.generation import Drafting, Generation, begin
from coordinator.serving.requests import CompletionRequest
from specwire.errors import CapacityError, NoWorkerError, QueueFullError, RemoteWorkerError

RECENT = 16  # generations whose durations estimate Retry-After
# Generations active at once (--decode-concurrency): eight chains of k = 2 verify in one pass that the M2
# Ultra takes in one position's time (24 positions; plan --profile paper: 7.24x one request alone).
DEFAULT_CONCURRENCY = 8


class Scheduler(Batching):
    """Admits requests, runs up to ``concurrency`` of them a round each in turn, queues ``max_queue`` more."""

    def __init__(
        self,
        runtime: Runtime,
        sources: DraftSources,
        drafting: Drafting,
        max_queue: int,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        super().__init__()
        self.runtime = runtime
        self.sources = sources
        self.drafting = drafting
        self.max_queue = max_queue
        self.concurrency = concurrency
        self._live: set[Generation] = set()  # active and waiting
        self._waiting: deque[Generation] = deque()
        self._active: list[Generation] = []
        self._arrived = anyio.Event()
        self._durations: deque[float] = deque(maxlen=RECENT)
        self._running = False
        caches = sources.caches
        self._target_cache = caches.of(f"target:{sources.target.spec}") if caches is not None else None
        self.last_drafting: dict[str, Any] | None = None  # the drafting policy's report of the last request
        self.planner: Planner | None = None  # the drafting policy's, as the last request (or start) had it

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Scheduler]:
        """Run generations for as long as the block lasts."""
        async with anyio.create_task_group() as tg:
            self._running = True
            tg.start_soon(self._drive)
            try:
                yield self
            finally:
                self._running = False
                for generation in self._live:  # each stops at its next round and closes its session
                    generation.halt.set()
                tg.cancel_scope.cancel()

    @property
    def pending(self) -> int:
        """Requests active or waiting whose client is still there."""
        return sum(1 for g in self._live if not g.halt.is_set())

    def submit(self, request: CompletionRequest) -> Generation:
        """Queue ``request``; raises ``QueueFullError`` when ``max_queue`` already wait."""
        if not self._running:
            raise RuntimeError("the scheduler is not running")
        if self.pending >= self.concurrency + self.max_queue:
            waiting = self.pending - self.concurrency
            raise QueueFullError(
                f"{waiting} requests are already waiting (the most is {self.max_queue})", self.retry_after_s()
            )
        send, receive = anyio.create_memory_object_stream[list[int]](math.inf)
        generation = Generation(request, receive, send=send)
        self._live.add(generation)
        self._waiting.append(generation)
        self._arrived.set()
        return generation

    def status(self) -> list[dict[str, Any]]:
        """Each request active or waiting: its state, set-up, prompt, tokens and rounds so far, tok/s."""
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
                    "batched": g.batched,
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
        ahead = max(1, self.pending - self.concurrency - self.max_queue + 1)
        return max(1, math.ceil(typical * ahead / self.concurrency))

    # The driver: one task, rounds in turn.

    async def _drive(self) -> None:
        try:
            while True:
                await self._admit()
                if not self._active:
                    await self._arrived.wait()
                    self._arrived = anyio.Event()
                    continue
                if self._batch is not None and self._batch.rows:
                    await self._batch_round(self._batch)
                for generation in [g for g in self._active if not g.batched]:
                    await self._round(generation)
        finally:
            with anyio.CancelScope(shield=True):
                for generation in [*self._active, *self._waiting]:
                    await self._finish(generation)

    async def _admit(self) -> None:
        """Start waiting requests while there is a free slot (a request whose client left ends unstarted).
        Those that join the batch join together, their prompts prefilled in the same passes."""
        joining: list[tuple[Generation, int]] = []
        batch = None
        while self._waiting and len(self._active) + len(joining) < self.concurrency:
            generation = self._waiting.popleft()
            generation.started_ns = time.perf_counter_ns()
            if generation.halt.is_set():  # its client left while it waited
                await self._finish(generation)
                continue
            try:
                together = len(self._active) + len(joining) + len(self._waiting) > 0
                batch = await self._batch_for() if together else None
                k = await self._batch_k(generation) if batch is not None else None
                if batch is not None and k is not None:
                    joining.append((generation, k))
                    continue
                await self._begin(generation)
                self._active.insert(0, generation)  # its first round next: its first token comes soonest
            except Exception as err:  # handed to the request's handler, which answers with it
                generation.error = err
                await self._finish(generation)
        if not joining or batch is None:
            return
        joined = await self._join(joining, batch)
        for generation, _ in joining:
            if generation in joined:
                self._active.insert(0, generation)
            else:
                await self._finish(generation)
        if joined:
            for other in [g for g in self._active if not g.batched]:
                await self._move_or_fail(other)

    async def _move_or_fail(self, generation: Generation) -> None:
        """Move a request running alone into the batch; if that fails, it ends with the error."""
        batch = self._batch
        if batch is None:
            return
        try:
            await self._move(generation, batch)
        except Exception as err:  # handed to that request's handler, which answers with it
            generation.error = err
            self._active.remove(generation)
            await self._finish(generation)

    def _deliver(self, generation: Generation) -> Callable[[list[int]], None]:
        """What the engine calls, on the compute thread, with each round's tokens."""
        loop = asyncio.get_running_loop()
        send = generation.send
        assert send is not None

        def deliver(tokens: list[int]) -> None:  # on the compute thread
            generation.generated += len(tokens)
            generation.rounds += 1
            loop.call_soon_threadsafe(_send_quietly, send, list(tokens))

        return deliver

    async def _begin(self, generation: Generation) -> None:
        source, generation.source = await self._open()
        deliver = self._deliver(generation)
        if isinstance(source, AutoDraftSource):
            self.planner = source.planner
        k = 0 if source is None else AUTO_K if isinstance(source, AutoDraftSource) else self.drafting.k
        generation.source["k"] = k
        decoder = SpeculativeDecoder(self.sources.target, source, prefix_cache=self._target_cache)
        generation.decoding = await self.runtime.compute.run(begin, decoder, generation, k, deliver)

    async def _round(self, generation: Generation) -> None:
        decoding = generation.decoding
        assert decoding is not None
        alone = len(self._active) == 1
        try:
            if await self.runtime.compute.run(self._rounds, decoding, alone):
                return
        except Exception as err:  # handed to the request's handler, which answers with it
            generation.error = err
        self._active.remove(generation)
        await self._finish(generation)

    def _rounds(self, decoding: Decoding, alone: bool) -> bool:
        """One round; a generation alone runs on, in the same compute job, until a request arrives (a
        hop to the event loop and back each round would cost the one request it serves). Compute thread."""
        while decoding.round():
            if not alone or self._waiting:
                return True
        return False

    async def _finish(self, generation: Generation) -> None:
        """End a generation: close its draft source, hand over its result, free its place."""
        decoding = generation.decoding
        try:
            if decoding is not None:
                await self.runtime.compute.run(decoding.close)
                if generation.error is None:
                    generation.result = decoding.result
                    source = decoding.source
                    generation.source.update(drafted_by(source))
                    if isinstance(source, AutoDraftSource):
                        self.last_drafting = generation.source["drafting"] = source.report()
                self._durations.append((time.perf_counter_ns() - generation.started_ns) / 1e9)
        except Exception as err:
            generation.error = generation.error or err
        finally:
            generation.decoding = None
            self._live.discard(generation)
            if generation.send is not None:
                generation.send.close()
            generation.done.set()

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
