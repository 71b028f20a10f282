"""Pre-speculation's branches drafted together: one forward pass over a batch of sequences.

A draft model decoding one token reads every weight for a few operations
each, so a pass over B sequences costs about what a pass over one does until
B is large (``specwire.emulation.profile``: the pass curve's batch end, with its
source). Pre-speculation's branches all start from the drafter's cache (the
context and the drafts just sent), so they can be drafted side by side: a
branch is a row, its KV cache the drafter's up to its branch point,
left-padded to the longest row (mlx-lm's ``BatchKVCache``); each step feeds
every row its next token (the branch's own token, then its last draft).

Rows join when their source is ready (the bonus branches after the probe
pass that ranks them) and leave when their k drafts are done; a row that
leaves keeps its cache (``cache_of``), so a worker that serves that branch
takes its cache as its own (``Drafter.install``) instead of feeding the
branch's tokens again.

Only drafters whose every cache layer is a plain KV cache are batched
(``batchable``): a recurrent layer's state (Qwen3.5) or a rotating window
would need per-row state handling that mlx-lm's batch caches do not give a
drafter's kept states; those draft their branches one at a time.

All of this runs on the worker's compute thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache, KVCache

from specwire.drafting.choices import top_choices
from specwire.drafting.sampling import SparseDistribution, choose_draft_token

if TYPE_CHECKING:
    from specwire.drafting.drafter import Drafter, Drafting


def batchable(cache: Sequence[Any]) -> bool:
    """True when every layer of a prompt cache is a plain KV cache."""
    return all(type(layer) is KVCache for layer in cache)


def cache_view(layer: Any, length: int) -> KVCache:
    """A KV cache holding the first ``length`` positions of ``layer`` (no copy until merged)."""
    view = KVCache()
    view.keys = layer.keys[..., :length, :]
    view.values = layer.values[..., :length, :]
    view.offset = length
    return view


class BranchBatch:
    """Branches (``Drafting`` blocks) advanced one batched forward pass at a time."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.rows: list[Drafting] = []
        self.cache: list[BatchKVCache] | None = None
        self.finished: dict[int, list[KVCache]] = {}  # id(block) -> the cache of a row that left
        self.passes = 0

    def add(self, blocks: Sequence[Drafting], source: Sequence[Any], holds: Sequence[int]) -> None:
        """Add rows whose caches are prefixes of ``source``, a cache that holds the tokens ``holds``.

        Each block's prefix, but its last token, must be a prefix of ``holds``.
        """
        for block in blocks:
            if block.tokens or list(holds[: len(block.prefix) - 1]) != block.prefix[:-1]:
                raise ValueError("a branch joins a batch before drafting, from a cache that holds its prefix")
        lengths = [len(b.prefix) - 1 for b in blocks]
        joining = [BatchKVCache.merge([cache_view(layer, n) for n in lengths]) for layer in source]
        if self.cache is None:
            self.cache = joining
        else:
            for mine, theirs in zip(self.cache, joining, strict=True):
                mine.extend(theirs)
        self.rows.extend(blocks)

    def step(self) -> list[Drafting]:
        """One pass: every row gains a draft; returns the rows that finished (and left)."""
        if not self.rows or self.cache is None:
            return []
        drafter = self.drafter
        t0 = time.perf_counter_ns()
        feed = [(b.prefix + b.tokens)[-1] for b in self.rows]
        logits = drafter.batch_pass(mx.array(feed)[:, None], self.cache)[:, -1, :]
        if drafter.params.greedy:
            self._greedy(logits)
        else:
            self._sampled(logits)
        self.passes += 1
        drafter.forward_passes += 1
        spent = time.perf_counter_ns() - t0
        for b in self.rows:
            b.forward_passes += 1
            b.compute_ns += spent
        done = [i for i, b in enumerate(self.rows) if b.done]
        for i in done:
            self.finished[id(self.rows[i])] = [layer.extract(i) for layer in self.cache]
        left = [self.rows[i] for i in done]
        if done:
            finished = set(done)
            keep = [i for i in range(len(self.rows)) if i not in finished]
            self.rows = [self.rows[i] for i in keep]
            if keep:
                for layer in self.cache:
                    layer.filter(mx.array(keep))
            else:
                self.cache = None
        return left

    def cache_of(self, block: Drafting) -> list[KVCache] | None:
        """The cache of ``block``'s row (it holds the prefix and all its drafts but the last)."""
        if id(block) in self.finished:
            return self.finished[id(block)]
        for i, row in enumerate(self.rows):
            if row is block and self.cache is not None:
                return [layer.extract(i) for layer in self.cache]
        return None

    def _greedy(self, logits: mx.array) -> None:
        size = max((b.alternatives for b in self.rows), default=0)
        tokens = mx.argmax(logits, axis=-1)
        if size:
            ids, probs = top_choices(logits.astype(mx.float32), size)
            self.drafter.settle(tokens, ids, probs)
            ids_np, probs_np = np.array(ids), np.array(probs, dtype=np.float64)
        else:
            self.drafter.settle(tokens)
        tokens_np = np.array(tokens).astype(int)
        for i, block in enumerate(self.rows):
            if block.alternatives:  # top_choices ranks them most probable first
                n = block.alternatives
                block.candidates.append(SparseDistribution(ids_np[i, :n].astype(np.int64), probs_np[i, :n]))
            block.tokens.append(int(tokens_np[i]))  # the token last: readers on other threads take it

    def _sampled(self, logits: mx.array) -> None:
        rows = logits.astype(mx.float32)
        self.drafter.settle(rows)
        host = np.array(rows)
        for i, block in enumerate(self.rows):
            token, dist = choose_draft_token(host[i], self.drafter.params, block.rng)
            assert dist is not None
            block.dists.append(dist)
            if block.alternatives:
                block.candidates.append(dist)
            block.tokens.append(token)
