"""The scheduler's batch: concurrent requests decoded together (``coordinator.decoding.batch``).

``Scheduler`` (``coordinator.serving.scheduler``) is a ``Batching``: it
admits requests and calls ``_join`` and ``_move`` when two or more are
active and the drafting set-up can batch (``_batch_for``), runs the batch's
rounds (``_batch_round``), and under auto hands the last request left back
to run alone (``_release``). The scheduler gives this class its state and
three of its steps (``_finish``, ``_open``, ``_deliver``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import deque
from collections.abc import Callable
from typing import Any

from coordinator.decoding.batch import DecodingBatch, batch_refusal
from coordinator.decoding.engine import Decoding, SpeculativeDecoder
from coordinator.drafting.auto.policy import AUTO_K, AutoDraftSource
from coordinator.drafting.base import DraftSource
from coordinator.drafting.factory import DraftSources
from coordinator.drafting.provenance import drafted_by
from coordinator.planning.planner import Planner
from coordinator.runtime import Runtime
from coordinator.serving.generation import Drafting, Generation, begin
from specwire.drafting.prefix_cache import PrefixCache
from specwire.models.loading import LoadedModel

RELEASE_MIN_TOKENS = 16  # tokens left, below which a batch's last request stays in it: a draft source's
# start (a worker session and its prefill) would cost about as much as the rounds it could speed up


class Batching:
    """The batch's half of the scheduler (module docstring)."""

    runtime: Runtime
    sources: DraftSources
    drafting: Drafting
    concurrency: int
    planner: Planner | None
    _active: list[Generation]
    _waiting: deque[Generation]
    _target_cache: PrefixCache | None

    def __init__(self) -> None:
        self._batch: DecodingBatch | None = None
        self._batch_draft: LoadedModel | None = None
        self.batch_note: str | None = None  # why concurrent requests are not batched (None: they are)

    # The scheduler's steps this class calls.

    async def _finish(self, generation: Generation) -> None:
        raise NotImplementedError

    async def _open(self) -> tuple[DraftSource | None, dict[str, Any]]:
        raise NotImplementedError

    def _deliver(self, generation: Generation) -> Callable[[list[int]], None]:
        raise NotImplementedError

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
        elif spec.kind not in ("auto", "local", "none"):
            self.batch_note = f"--draft {spec.kind}: requests a worker drafts for take their rounds in turn"
        else:
            draft = await self.sources.local_model(spec.local) if spec.local and spec.kind != "none" else None
            self.batch_note = batch_refusal(target, draft)
            if self.batch_note is None:
                caches = self.sources.caches
                prompts = caches.of(f"draft:{draft.spec}") if caches is not None and draft else None
                self._batch_draft = draft
                self._batch = DecodingBatch(target, draft, prompts)
        return self._batch

    async def _batch_k(self, generation: Generation) -> int | None:
        """The drafts a round for ``generation`` in the batch: ``local``'s k, 0 with no draft model, or
        the planner's best set-up at its temperature among the target alone and local chains (auto: 0
        where the target alone is fastest); None if the planner ranks neither."""
        spec = self.drafting.spec
        if self._batch_draft is None:
            return 0
        if spec.kind == "local":
            return self.drafting.k
        if self.planner is None:
            self.planner, _ = await self.sources.auto(spec)
        temperature = generation.request.params.temperature
        ranking = self.planner.ranking(temperature, self.planner.prior(temperature))
        return next((p.setup.k for p in ranking if p.setup.mode in ("ar", "local")), None)

    async def _join(self, joining: list[tuple[Generation, int]], batch: DecodingBatch) -> list[Generation]:
        """Begin the generations ``joining`` (each with its k) in ``batch``, with no draft source of their
        own, their prompts prefilled together (``DecodingBatch.admit``); returns those that joined (one
        that could not begin has its ``error``; if the prefill fails, every one has it)."""
        decoder = SpeculativeDecoder(self.sources.target, None, prefix_cache=self._target_cache)
        delivers = [self._deliver(generation) for generation, _ in joining]

        def start() -> list[tuple[Generation, int]]:
            begun = []
            for (generation, k), deliver in zip(joining, delivers, strict=True):
                try:
                    generation.decoding = begin(decoder, generation, 0, deliver, prefill=False)
                    begun.append((generation, k))
                except Exception as err:  # handed to the request's handler, which answers with it
                    generation.error = err
            try:
                batch.admit([g.decoding for g, _ in begun if g.decoding is not None], [k for _, k in begun])
            except Exception as err:
                for generation, _ in begun:
                    generation.error = err
                return []
            return begun

        joined = await self.runtime.compute.run(start)
        for generation, k in joined:
            self._batched(generation, k)
        return [generation for generation, _ in joined]

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
        described = f"local:{draft.spec}" if draft is not None and k else "none"
        generation.source.update({"draft": described, "batched": True, "k": k})

    async def _batch_round(self, batch: DecodingBatch) -> None:
        """A round of the batch (more, in one compute job, while nothing else runs or waits); then the
        generations that ended are finished."""
        others = any(not g.batched for g in self._active)
        try:
            ended = await self.runtime.compute.run(self._batch_rounds, batch, others)
        except Exception as err:  # every batched request answers with it; the next ones start a new batch
            ended = []
            for generation in self._active:
                if generation.batched and generation.decoding is not None:
                    generation.error = err
                    ended.append(generation.decoding)
            batch.close()
            self._batch = None
        for decoding in ended:
            found = next((g for g in self._active if g.decoding is decoding), None)
            if found is not None:
                self._active.remove(found)
                await self._finish(found)
        if self._batch is batch and len(batch.rows) == 1 and not self._waiting:
            await self._release(batch)

    async def _release(self, batch: DecodingBatch) -> None:
        """Under auto, the batch's last request goes on alone with a draft source of its own, chosen
        again (a worker's tree, local tree SD, ...), unless too few tokens are left to pay for its start.
        With ``--draft none`` it goes on alone too: a round alone (a KV cache of its own) is shorter than
        the batch's round of one row (its ragged mask and offsets: 9.58 ms on the H100 with the default
        model, ``docs/serving.md``, where ``serve`` alone made 159 tok/s, 6.3 ms a token, HTTP
        included), and leaving costs one copy of its cache."""
        decoding = batch.rows[0].decoding
        generation = next((g for g in self._active if g.decoding is decoding), None)
        left = decoding.max_tokens - len(decoding.result.tokens)
        kind = self.drafting.spec.kind
        if kind not in ("auto", "none") or generation is None or left < 2:
            return
        if kind == "auto" and left < RELEASE_MIN_TOKENS:
            return
        if (decoding.halt is not None and decoding.halt.is_set()) or "release_failed" in generation.source:
            return
        # Its own draws from here: a fresh source numbers its blocks from 0, and the streams this
        # generation already drew from must not be drawn again (the drafts would depend on earlier ones).
        params = dataclasses.replace(decoding.params, seed=_fresh_seed(decoding))
        source = None
        try:  # the new source first: if it cannot be had, the request stays in the batch
            source, described = await self._open()
            k = 0 if source is None else AUTO_K if isinstance(source, AutoDraftSource) else self.drafting.k
            if source is not None:
                start = functools.partial(source.start, decoding.context(), params, min(k, left - 1))
                await self.runtime.compute.run(start)
        except Exception as err:
            if source is not None:
                await self.runtime.compute.run(source.close)
            generation.source["release_failed"] = str(err)
            return
        await self.runtime.compute.run(batch.release)
        generation.batched = False
        decoding.attach_source(source, k)
        generation.source.update(
            {**described, "batched": False, "left_batch_at": len(decoding.result.tokens)}
        )

    def _batch_rounds(self, batch: DecodingBatch, others: bool) -> list[Decoding]:
        """Rounds of the batch until one ends a generation, or another request runs or arrives. Compute
        thread."""
        while True:
            ended = batch.round()
            if ended or others or self._waiting or not batch.rows:
                return ended


def _fresh_seed(decoding: Decoding) -> int:
    """A draft seed for ``decoding``'s source after the batch, unlike its own (whose block streams it
    drew with in the batch)."""
    return (decoding.params.seed * 1_000_003 + len(decoding.result.rounds) + 1) % 2**63
