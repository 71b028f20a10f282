"""One KV cache for a batch of sequences of different lengths, each rolled back on its own.

mlx-lm's ``BatchKVCache`` trims every row alike; speculative decoding needs
each row to keep its own accepted count. Here each row's positions live in
storage *slots*, and ``RaggedLayout.slots[b]`` maps row b's positions to
them. A pass writes ``n`` slots at the common write index for every row (a
row with fewer tokens pads; its pad slots never become positions), and
``commit(counts)`` then makes the first ``counts[b]`` of row b's new slots
its next positions. ``truncate(b, length)`` drops a row's positions past
``length`` (its rejected drafts): their slots become holes that no query
attends to. A new token's rotary position is its row's length, whatever its
slot (``offset`` is per row), so a hole changes nothing a query computes.
``compact()`` moves every row's positions together, left-padded to the
longest, once holes take more than half the storage.

Every layer of the model shares one ``RaggedLayout``; each layer's
``RaggedKV`` holds its keys and values. Only models whose every layer is a
plain ``KVCache`` batch this way (``batchable``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache

STEP = 256  # slots a layer's storage grows by
COMPACT_SHARE = 0.5  # of the storage in holes, past which ``compact`` moves the rows together
COMPACT_MIN_SLOTS = 64


def batchable(model: Any) -> bool:
    """Whether every layer of ``model``'s cache is a plain KV cache (none recurrent, windowed, quantized)."""
    return all(type(layer) is KVCache for layer in make_prompt_cache(model))


class RaggedLayout:
    """Where each row's positions are in the storage every layer shares (module docstring)."""

    def __init__(self) -> None:
        self.slots: list[np.ndarray] = []  # row -> its positions' slots, in order
        self.size = 0  # slots written so far: the next pass writes from here
        self.layers: list[RaggedKV] = []
        self._mask: mx.array | None = None
        self._offsets: mx.array | None = None

    @property
    def rows(self) -> int:
        return len(self.slots)

    def lengths(self) -> list[int]:
        """Each row's positions."""
        return [len(s) for s in self.slots]

    def begin(self, n: int) -> None:
        """Prepare a pass of ``n`` new slots a row: its mask (each row's positions, then causal among the
        new slots) and each row's rotary offset."""
        valid = np.zeros((self.rows, self.size), dtype=bool)
        for b, slots in enumerate(self.slots):
            valid[b, slots] = True
        causal = np.tril(np.ones((n, n), dtype=bool))
        mask = np.concatenate(
            [
                np.broadcast_to(valid[:, None, :], (self.rows, n, self.size)),
                np.broadcast_to(causal, (self.rows, n, n)),
            ],
            axis=2,
        )
        self._mask = mx.array(mask[:, None])
        self._offsets = mx.array(self.lengths(), dtype=mx.int32)

    def commit(self, n: int, counts: Sequence[int]) -> None:
        """After a pass of ``n`` slots a row: row b's first ``counts[b]`` new slots become its positions."""
        for b, count in enumerate(counts):
            if not 0 <= count <= n:
                raise ValueError(f"row {b} keeps {count} of a pass's {n} slots")
            self.slots[b] = np.concatenate([self.slots[b], self.size + np.arange(count)])
        self.size += n
        self._mask = self._offsets = None

    def truncate(self, row: int, length: int) -> None:
        """Keep row ``row``'s first ``length`` positions."""
        self.slots[row] = self.slots[row][:length]

    def holes(self) -> int:
        """Storage slots that hold no row's position."""
        return self.rows * self.size - sum(self.lengths())

    def tidy(self) -> None:
        """``compact`` once holes take more than ``COMPACT_SHARE`` of the storage."""
        if self.size >= COMPACT_MIN_SLOTS and self.holes() > COMPACT_SHARE * self.rows * self.size:
            self.compact()

    def compact(self) -> None:
        """Move every row's positions together, right-aligned to the longest row (left padding)."""
        self.rebuild([self.row(b) for b in range(self.rows)])

    def row(self, b: int) -> list[tuple[mx.array, mx.array]] | None:
        """Row ``b``'s keys and values, layer by layer, its positions in order ([1, heads, length, dim]);
        None while no row holds a position."""
        if self.layers and self.layers[0].keys is None:
            return None
        index = mx.array(self.slots[b].astype(np.int32))
        return [
            (
                mx.take(layer.stored[0][b : b + 1], index, axis=2),
                mx.take(layer.stored[1][b : b + 1], index, axis=2),
            )
            for layer in self.layers
        ]

    def remove(self, row: int) -> None:
        """Drop row ``row``."""
        keep = [b for b in range(self.rows) if b != row]
        if not keep:
            self.slots, self.size = [], 0
            for layer in self.layers:
                layer.keys = layer.values = None
            return
        index = mx.array(keep)
        for layer in self.layers:
            if layer.keys is not None and layer.values is not None:
                layer.keys, layer.values = layer.keys[index], layer.values[index]
        del self.slots[row]
        self.tidy()

    def add(self, layers: Sequence[tuple[mx.array, mx.array]] | None) -> None:
        """A new last row holding ``layers``' keys and values ([1, heads, length, dim] each, layer by
        layer; None for a row with no position yet)."""
        self.rebuild([*(self.row(b) for b in range(self.rows)), layers])

    def rebuild(self, rows: Sequence[Sequence[tuple[mx.array, mx.array]] | None]) -> None:
        """The storage made anew from each row's keys and values (None: no positions yet), left-padded to
        the longest row."""
        lengths = [pairs[0][0].shape[2] if pairs else 0 for pairs in rows]
        size = max(lengths)
        capacity = size + STEP
        shaped = next((pairs for pairs in rows if pairs), None)
        for i, layer in enumerate(self.layers):
            if shaped is None:  # no row holds a position yet: the first pass sizes the storage
                layer.keys = layer.values = None
                continue
            empty = shaped[i][0][:, :, :0], shaped[i][1][:, :, :0]
            keys = [_padded((pairs[i] if pairs else empty)[0], size, capacity) for pairs in rows]
            values = [_padded((pairs[i] if pairs else empty)[1], size, capacity) for pairs in rows]
            layer.keys, layer.values = mx.concatenate(keys), mx.concatenate(values)
        mx.eval(*[a for layer in self.layers for a in (layer.keys, layer.values) if a is not None])
        self.slots = [np.arange(size - n, size) for n in lengths]
        self.size = size
        self._mask = self._offsets = None


def _padded(a: mx.array, size: int, capacity: int) -> mx.array:
    """``a`` ([1, heads, n, dim]) placed to end at slot ``size`` of ``capacity`` slots, zeros elsewhere."""
    _, heads, n, dim = a.shape
    out = mx.zeros((1, heads, capacity, dim), dtype=a.dtype)
    out[:, :, size - n : size, :] = a
    return out


class RaggedKV:
    """One layer's keys and values for every row of a ``RaggedLayout`` (mlx-lm's cache interface)."""

    def __init__(self, layout: RaggedLayout) -> None:
        self.layout = layout
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        layout.layers.append(self)

    @property
    def offset(self) -> mx.array:
        """Each row's rotary position for the pass's first new token: its length."""
        offsets = self.layout._offsets
        assert offsets is not None, "begin() the pass first"
        return offsets

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        mask = self.layout._mask
        assert mask is not None and mask.shape[2] == n, "begin() the pass with its number of slots"
        return mask

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        start, n = self.layout.size, keys.shape[2]
        if self.keys is None or start + n > self.keys.shape[2]:
            self._grow(start + n, keys, values)
        assert self.keys is not None and self.values is not None
        self.keys[:, :, start : start + n, :] = keys
        self.values[:, :, start : start + n, :] = values
        return self.keys[:, :, : start + n, :], self.values[:, :, : start + n, :]

    def _grow(self, needed: int, keys: mx.array, values: mx.array) -> None:
        b, heads, _, k_dim = keys.shape
        v_dim = values.shape[3]
        capacity = (needed + STEP - 1) // STEP * STEP
        new_k = mx.zeros((b, heads, capacity, k_dim), keys.dtype)
        new_v = mx.zeros((b, heads, capacity, v_dim), values.dtype)
        if self.keys is not None and self.values is not None:
            kept = self.layout.size
            new_k[:, :, :kept, :] = self.keys[:, :, :kept, :]
            new_v[:, :, :kept, :] = self.values[:, :, :kept, :]
        self.keys, self.values = new_k, new_v

    @property
    def stored(self) -> tuple[mx.array, mx.array]:
        """The keys and values stored (every slot); a layer that has stored none is an error."""
        assert self.keys is not None and self.values is not None, "no pass has stored keys yet"
        return self.keys, self.values

    @property
    def state(self) -> list[mx.array]:
        return [a for a in (self.keys, self.values) if a is not None]


def ragged_cache(model: Any) -> tuple[RaggedLayout, list[RaggedKV]]:
    """A layout and a layer cache per layer of ``model`` (``batchable`` models)."""
    layout = RaggedLayout()
    return layout, [RaggedKV(layout) for _ in make_prompt_cache(model)]


def kv_rows(cache: Sequence[Any]) -> list[tuple[mx.array, mx.array]] | None:
    """A single sequence's mlx-lm KV caches as (keys, values) by layer, its positions only (None: none)."""
    if not cache or cache[0].keys is None:
        return None
    return [(layer.keys[:, :, : layer.offset, :], layer.values[:, :, : layer.offset, :]) for layer in cache]
