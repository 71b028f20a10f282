"""The draft model as the coordinator sees it in the per-op baseline: a graph walked on the worker.

``RemoteDraftModel`` has the calling convention of an mlx-lm model
(``model(tokens, cache=cache)`` returns logits), so the shared drafter drives
it exactly as it drives a local model: the same feeding, the same sampling,
the same cache bookkeeping. Each call walks one forward pass of the graph on
the worker, grouped into calls by the granularity:

* ``op``: one operation per call (the walk's steps + 2 per forward pass);
* ``layer``: one call per transformer block, plus one before and one after;
* ``token``: one call per forward pass;
* ``round``: one call per draft round (greedy only): the worker chains the k
  passes, each after the first starting with ARGMAX, and the logits rows of
  all k come back together.

The cache lives on the worker; ``RemoteKVCache`` is its local shadow.
Rolling it back queues a KV_TRIM, sent in its own call at ``op``
granularity and at the head of the next call otherwise. A hybrid model's
recurrent layers (Qwen3.5) roll back only to the end of a forward pass, where
the worker keeps their state: its shadow, ``RemoteRecurrentCache``, rolls
back as a cache that restores itself does (``specwire.drafting.rollback``), so the
drafter asks only for positions the worker kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from coordinator.drafting.ggml_rpc.client import TensorClient
from coordinator.drafting.ggml_rpc.graph import ForwardGraph
from coordinator.runtime import LoopPortal

GRANULARITIES = ("op", "layer", "token", "round")


class RemoteKVCache:
    """The coordinator's shadow of the worker's KV cache: its length, and trims still to send."""

    def __init__(self) -> None:
        self.offset = 0
        self.pending_trim = 0

    def is_trimmable(self) -> bool:
        """The worker's cache can always be rolled back."""
        return True

    def trim(self, n: int) -> int:
        """Roll back ``n`` positions (sent with the next call)."""
        n = min(n, self.offset)
        self.offset -= n
        self.pending_trim += n
        return n

    @property
    def state(self) -> list[mx.array]:
        """Nothing is held locally."""
        return []


class RemoteRecurrentCache(RemoteKVCache):
    """The shadow of a hybrid model's cache: rolled back to kept pass ends, never trimmed freely."""

    def is_trimmable(self) -> bool:
        """Recurrent layers cannot drop positions."""
        return False

    def restore(self, position: int) -> None:
        """Roll back to a kept position (sent with the next call)."""
        self.trim(self.offset - position)


class RemoteDraftModel:
    """Walks the draft model's forward pass on a worker's tensor executor."""

    def __init__(
        self, portal: LoopPortal, client: TensorClient, graph: ForwardGraph, granularity: str
    ) -> None:
        self.portal = portal
        self.client = client
        self.graph = graph
        self.granularity = granularity
        self.cache = RemoteRecurrentCache() if graph.walk.recurrent else RemoteKVCache()
        # The drafter hands whole greedy rounds to models that can run them in one call.
        self.greedy_chain: Callable[[list[int], int, Any], list[int]] | None = (
            self._greedy_chain if granularity == "round" else None
        )

    def make_cache(self) -> list[RemoteKVCache]:
        """mlx-lm's cache hook: one shadow stands for every layer."""
        return [self.cache]

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        """One forward pass over ``inputs``; returns the last position's logits, shape [1, 1, vocab]."""
        tokens = np.array(inputs).reshape(-1).astype(int).tolist()
        rows = self.portal.call(self._forward, tokens)
        return mx.array(np.frombuffer(rows[-1], dtype=np.float32))[None, None]

    def _greedy_chain(self, feed: list[int], k: int, cache: Any = None) -> list[int]:
        """k greedy drafts in one call; the last one is not fed (as the drafter does)."""
        rows = self.portal.call(self._round, list(feed), k)
        return [int(np.argmax(np.frombuffer(row, dtype=np.float32))) for row in rows]

    async def _forward(self, tokens: list[int]) -> list[bytes]:
        groups = self.graph.forward(self.cache.offset, tokens)
        self.cache.offset += len(tokens)
        return await self._send(groups)

    async def _round(self, feed: list[int], k: int) -> list[bytes]:
        ops = [op for group in self.graph.forward(self.cache.offset, feed) for op in group]
        self.cache.offset += len(feed)
        for _ in range(k - 1):
            ops.extend(op for group in self.graph.forward(self.cache.offset, None) for op in group)
            self.cache.offset += 1
        return await self._send([ops])

    async def _send(self, groups: Sequence[list]) -> list[bytes]:
        """Send the groups of operations in calls of this granularity; returns the tensors."""
        trim = self.cache.pending_trim
        self.cache.pending_trim = 0
        if self.granularity == "op":
            if trim:
                await self.client.run([self.graph.trim(trim)], "trim")
            calls = [[op] for group in groups for op in group]
        elif self.granularity == "layer":
            calls = [list(group) for group in groups]
        else:
            calls = [[op for group in groups for op in group]]
        if trim and self.granularity != "op":
            calls[0].insert(0, self.graph.trim(trim))
        tensors: list[bytes] = []
        for ops in calls:
            tensors.extend(await self.client.run(ops, self.granularity))
        return tensors
