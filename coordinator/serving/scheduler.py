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
import functools
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from coordinator.decoding.batch import DecodingBatch, batch_refusal
from coordinator.decoding.engine import Decoding, GenerationResult, SpeculativeDecoder
from coordinator.drafting.auto import AUTO_K, AutoDraftSource
from coordinator.drafting.base import DraftSource
from coordinator.drafting.factory import DraftSources, DraftSpec
from coordinator.drafting.provenance import drafted_by
from coordinator.planning.planner import Planner
from coordinator.runtime import Runtime
from coordinator.serving.requests import CompletionRequest
from specwire.errors import CapacityError, NoWorkerError, QueueFullError, RemoteWorkerError
from specwire.models import LoadedModel

RECENT = 16  # generations whose durations estimate Retry-After
DEFAULT_CONCURRENCY = 4  # generations active at once (--decode-concurrency)
RELEASE_MIN_TOKENS = 16  # tokens left, below which a batch's last request stays in it: a draft source's
# start (a worker session and its prefill) would cost about as much as the rounds it could speed up


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
    decoding: Decoding | None = None  # while active
    batched: bool = False  # decoded in the scheduler's batch (from joining it to its end)
    send: MemoryObjectSendStream[list[int]] | None = None

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
    """Admits requests, runs up to ``concurrency`` of them a round each in turn, queues ``max_queue`` more."""

    def __init__(
        self,
        runtime: Runtime,
        sources: DraftSources,
        drafting: Drafting,
        max_queue: int,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
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
        self._batch: DecodingBatch | None = None
        self._batch_draft: LoadedModel | None = None
        self.batch_note: str | None = None  # why concurrent requests are not batched (None: they are)

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

    def batch_status(self) -> dict[str, Any]:
        """How concurrent requests are decoded: batched (rows now, rounds, most rows a round) or why not."""
        if self.batch_note is not None:
            return {"batched": False, "why_not": self.batch_note}
        batch = self._batch
        return {
            "batched": True,
            "rows": len(batch.rows) if batch else 0,
            "rounds": batch.rounds if batch else 0,
            "widest": batch.widest if batch else 0,
        }

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
        """Start waiting requests while there is a free slot (a request whose client left ends unstarted)."""
        while self._waiting and len(self._active) < self.concurrency:
            generation = self._waiting.popleft()
            generation.started_ns = time.perf_counter_ns()
            if generation.halt.is_set():  # its client left while it waited
                await self._finish(generation)
                continue
            try:
                together = len(self._active) + len(self._waiting) > 0
                batch = await self._batch_for() if together else None
                k = await self._batch_k(generation) if batch is not None else None
                if batch is not None and k is not None:
                    await self._join(generation, batch, k)
                    for other in [g for g in self._active if not g.batched]:
                        await self._move(other, batch)
                else:
                    await self._begin(generation)
                self._active.insert(0, generation)  # its first round next: its first token comes soonest
            except Exception as err:  # handed to the request's handler, which answers with it
                generation.error = err
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
        request, drafting = generation.request, self.drafting
        k = 0 if source is None else AUTO_K if isinstance(source, AutoDraftSource) else drafting.k
        generation.source["k"] = k
        decoder = SpeculativeDecoder(self.sources.target, source, prefix_cache=self._target_cache)
        generation.decoding = await self.runtime.compute.run(
            functools.partial(
                decoder.begin,
                request.prompt,
                max_tokens=request.max_tokens,
                k=k,
                params=request.params,
                on_tokens=deliver,
                halt=generation.halt,
            )
        )

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

    # The batch: requests decoded together (coordinator.decoding.batch).

    async def _batch_for(self) -> DecodingBatch | None:
        """The batch concurrent requests join, or None (``batch_note`` says why)."""
        if self._batch is not None:
            return self._batch
        if self.batch_note is not None:
            return None
        spec = self.drafting.spec
        target = self.sources.target
        if self.concurrency < 2:
            self.batch_note = "--decode-concurrency 1: one request at a time"
        elif spec.kind not in ("auto", "local") or not spec.local:
            self.batch_note = f"--draft {spec.kind}: a batch drafts with a local draft model (auto or local)"
        else:
            draft = await self.sources.local_model(spec.local)
            self.batch_note = batch_refusal(target, draft)
            if self.batch_note is None:
                caches = self.sources.caches
                prompts = caches.of(f"draft:{draft.spec}") if caches is not None else None
                self._batch_draft = draft
                self._batch = DecodingBatch(target, draft, prompts)
        return self._batch

    async def _batch_k(self, generation: Generation) -> int | None:
        """The drafts a round for ``generation`` in the batch: ``local``'s k, or the planner's best local
        chain at its temperature (auto); None if the planner has no local chain for it."""
        spec = self.drafting.spec
        if spec.kind == "local":
            return self.drafting.k
        if self.planner is None:
            self.planner, _ = await self.sources.auto(spec)
        temperature = generation.request.params.temperature
        ranking = self.planner.ranking(temperature, self.planner.prior(temperature))
        return next((p.setup.k for p in ranking if p.setup.mode == "local" and p.setup.k > 0), None)

    async def _join(self, generation: Generation, batch: DecodingBatch, k: int) -> None:
        """Begin ``generation`` with no draft source of its own, in ``batch``."""
        request, deliver = generation.request, self._deliver(generation)
        decoder = SpeculativeDecoder(self.sources.target, None, prefix_cache=self._target_cache)

        def begin() -> Decoding:
            decoding = decoder.begin(
                request.prompt,
                max_tokens=request.max_tokens,
                k=0,
                params=request.params,
                on_tokens=deliver,
                halt=generation.halt,
            )
            batch.join(decoding, k)
            return decoding

        generation.decoding = await self.runtime.compute.run(begin)
        self._batched(generation, k)

    async def _move(self, generation: Generation, batch: DecodingBatch) -> None:
        """Move a generation running alone into ``batch`` (it keeps its own draft source if no k fits)."""
        decoding = generation.decoding
        k = await self._batch_k(generation)
        if decoding is None or k is None:
            return
        source = decoding.source
        if isinstance(source, AutoDraftSource):
            generation.source["drafting_alone"] = source.report()
        generation.source.update(drafted_by(source))
        await self.runtime.compute.run(batch.join, decoding, k)
        self._batched(generation, k)

    def _batched(self, generation: Generation, k: int) -> None:
        generation.batched = True
        draft = self._batch_draft
        assert draft is not None
        generation.source.update({"draft": f"local:{draft.spec}", "batched": True, "k": k})

    async def _batch_round(self, batch: DecodingBatch) -> None:
        """A round of the batch (more, in one compute job, while nothing else runs or waits); then the
        generations that ended are finished."""
        others = any(not g.batched for g in self._active)
        try:
            ended = await self.runtime.compute.run(self._batch_rounds, batch, others)
        except Exception as err:  # every batched request answers with it; the next ones start a new batch
            ended = [row.decoding for row in batch.rows]
            for generation in self._active:
                if generation.batched:
                    generation.error = err
            batch.close()
            self._batch = None
        for decoding in ended:
            generation = next(g for g in self._active if g.decoding is decoding)
            self._active.remove(generation)
            await self._finish(generation)
        if self._batch is batch and len(batch.rows) == 1 and not self._waiting:
            await self._release(batch)

    async def _release(self, batch: DecodingBatch) -> None:
        """Under auto, the batch's last request goes on alone with a draft source of its own, chosen
        again (a worker's tree, local tree SD, ...), unless too few tokens are left to pay for its start."""
        row = batch.rows[0].decoding
        left = row.max_tokens - len(row.result.tokens)
        if self.drafting.spec.kind != "auto" or left < RELEASE_MIN_TOKENS:
            return
        decoding = await self.runtime.compute.run(batch.release)
        generation = next(g for g in self._active if g.decoding is decoding)
        generation.batched = False
        source = None
        try:
            source, described = await self._open()
            k = AUTO_K if isinstance(source, AutoDraftSource) else self.drafting.k
            if source is not None:
                await self.runtime.compute.run(
                    source.start, decoding.context(), decoding.params, min(k, left - 1)
                )
            decoding.attach_source(source, k)
            generation.source.update({**described, "batched": False, "left_batch_at": len(row.result.tokens)})
        except Exception as err:  # handed to the request's handler, which answers with it
            if source is not None:
                await self.runtime.compute.run(source.close)
            generation.error = err
            self._active.remove(generation)
            await self._finish(generation)

    def _batch_rounds(self, batch: DecodingBatch, others: bool) -> list[Decoding]:
        """Rounds of the batch until one ends a generation, or another request runs or arrives. Compute
        thread."""
        while True:
            ended = batch.round()
            if ended or others or self._waiting or not batch.rows:
                return ended

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
